"""lm-evaluation-harness: the ``rpt`` model through lm-eval's own command line, offline, on the local
GSM8K task; generation through the RPT sampler; log-likelihoods from NTP against a direct
computation."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.eval_helpers import gsm8k_folder, long_context_checkpoint
from tests.helpers.scripts import ROOT

lm_eval = pytest.importorskip("lm_eval")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    return long_context_checkpoint(tmp_path_factory.mktemp("lm_eval_ckpt") / "rpt")


# slow (13 s, an lm-eval start-up in a subprocess): the adapter's generation and loglikelihood, the entry
# point's registration and the task file stay in the default suite (the tests below)
@pytest.mark.slow
def test_cli_runs_offline_and_writes_results(ckpt, tmp_path):
    # lm-eval runs in tmp/work, the task reads ../shared/data/gsm8k from there, as from a checkout
    work = tmp_path / "work"
    work.mkdir()
    gsm8k_folder(tmp_path / "shared" / "data" / "gsm8k")
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_DATASETS_CACHE=str(tmp_path / "hf"), HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(ROOT / "eval" / "lm_eval.py"), "--model", "rpt", "--model_args",
           f"pretrained={ckpt},rpt_iters=1,rpt_window=2,max_new_tokens=8,confidence=0.5",
           "--tasks", "gsm8k_local", "--include_path", str(ROOT / "eval" / "lm_eval_tasks"), "--limit", "4",
           "--num_fewshot", "2", "--output_path", str(out), "--log_samples"]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [results_file] = list(out.rglob("results_*.json"))
    results = json.loads(results_file.read_text())
    scores = results["results"]["gsm8k_local"]
    assert 0.0 <= scores["exact_match,strict-match"] <= 1.0 and "exact_match,flexible-extract" in scores
    assert results["n-samples"]["gsm8k_local"]["effective"] == 4
    assert results["config"]["model_args"]["rpt_iters"] == 1
    [samples_file] = list(out.rglob("samples_gsm8k_local_*.jsonl"))
    samples = [json.loads(line) for line in samples_file.read_text().splitlines()]
    assert {s["doc_id"] for s in samples} == {0, 1, 2, 3}  # a line per document and filter
    assert all("Question:" not in s["resps"][0][0] for s in samples)


class _Request:
    def __init__(self, *args) -> None:
        self.args = args


def test_adapter_generation_and_loglikelihood(ckpt):
    from rpt.evaluation.batched_generation import generate_texts, load_checkpoint
    from rpt.evaluation.lm_eval_adapter import RPTLM
    from rpt.sampling import SamplingConfig

    lm = RPTLM(pretrained=ckpt, rpt_iters=1, rpt_window="2", confidence=0.5, ptp_greedy="true", max_new_tokens=6,
               batch_size=2)
    assert lm.config.rpt_iters == 1 and lm.config.rpt_window == 2 and lm.config.ptp_greedy is True
    # generation: the RPT sampler with the task's stop strings added, same text as calling it directly
    texts = lm.generate_until([_Request("def add(a, b):", {"until": ["\n\n"], "max_gen_toks": 6}),
                               _Request("class Point:", {"until": ["\n\n"], "max_gen_toks": 6})])
    model, tokenizer, _ = load_checkpoint(ckpt)
    config = SamplingConfig(max_new_tokens=6, rpt_iters=1, rpt_window=2, confidence=0.5, stop=["\n\n"],
                            eos_token_id=tokenizer.eos_token_id)
    direct = generate_texts(model, tokenizer, ["def add(a, b):", "class Point:"], config, batch_size=2)
    assert texts == [d["text"] for d in direct]

    # log-likelihood: the sum of NTP log-probabilities of the continuation, computed directly
    context, continuation = "def fib(n):", "\n    return n"
    [(logprob, greedy)] = lm.loglikelihood([_Request(context, continuation)])
    ctx = tokenizer(context, add_special_tokens=False)["input_ids"]
    whole = tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([whole])).logits[0].double().log_softmax(-1)
    expected = sum(float(logits[i - 1, whole[i]]) for i in range(len(ctx), len(whole)))
    assert logprob == pytest.approx(expected, abs=1e-4) and isinstance(greedy, bool)
    # batched with a longer request (padding) gives the same number
    both = lm.loglikelihood([_Request(context, continuation), _Request("for i in range(10):", "\n    print(i)")])
    assert both[0][0] == pytest.approx(logprob, abs=1e-4)
    [rolling] = lm.loglikelihood_rolling([_Request("def add(a, b):\n    return a + b\n")])
    assert math.isfinite(rolling) and rolling < 0


def test_unknown_model_arg_is_one_clear_error(ckpt):
    from rpt.evaluation.lm_eval_adapter import RPTLM

    with pytest.raises(ValueError, match="rpt_iterations are not SamplingConfig fields"):
        RPTLM(pretrained=ckpt, rpt_iterations=1)


def test_local_task_yaml_points_at_the_shared_data():
    text = (ROOT / "eval" / "lm_eval_tasks" / "gsm8k_local.yaml").read_text()
    assert "../shared/data/gsm8k/test.jsonl" in text and "task: gsm8k_local" in text
    assert Path(ROOT / "eval" / "lm_eval.py").is_file()


def test_long_prompts_are_cut_from_the_left_to_fit(ckpt):
    from rpt.evaluation.lm_eval_adapter import RPTLM

    lm = RPTLM(pretrained=ckpt, max_length=64)
    prompt = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(40)) + "def add(a, b):"
    fitted = lm.fit(prompt, 48)
    assert len(lm.tokenizer(fitted)["input_ids"]) <= 48 and prompt.endswith(fitted) and fitted.endswith("def add(a, b):")
    assert lm.fit("def add(a, b):", 48) == "def add(a, b):"
    assert len(lm.generate_until([_Request(prompt, {"until": ["\n\n"], "max_gen_toks": 8})])) == 1


def test_package_registers_the_model_through_the_lm_eval_entry_point():
    """pyproject's ``lm_eval.models`` entry point names a class lm-eval can load by name, no import flags."""
    from importlib.metadata import EntryPoint

    import tomllib
    from lm_eval.api.model import LM

    with open(ROOT / "pyproject.toml", "rb") as f:
        points = tomllib.load(f)["project"]["entry-points"]["lm_eval.models"]
    assert list(points) == ["rpt"]
    cls = EntryPoint(name="rpt", value=points["rpt"], group="lm_eval.models").load()
    assert issubclass(cls, LM) and cls.__name__ == "RPTLM"
    from lm_eval.api.registry import get_model

    assert get_model("rpt") is cls  # the same class the import registers for lm-eval <= 0.4.13


@pytest.mark.parametrize("args, key", [
    ({"rpt_iters": 1.7}, "rpt_iters"), ({"ptp_greedy": "ture"}, "ptp_greedy"), ({"batch_size": "many"}, "batch_size"),
    ({"dtype": "float64"}, "dtype"), ({"max_length": -4}, "max_length"), ({"device": "tpu9"}, "device"),
    ({"confidence": 2.0}, "confidence"),
])
def test_bad_model_args_are_named_before_loading(tmp_path, args, key):
    from rpt.evaluation.lm_eval_adapter import RPTLM

    # a checkpoint that does not exist: each bad argument is reported before anything is loaded
    with pytest.raises(ValueError, match=key):
        RPTLM(pretrained=str(tmp_path / "absent"), **args)


@pytest.mark.slow  # three lm-eval start-ups
def test_lm_eval_errors_are_one_line(ckpt, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1")
    for model_args, task, expected in ((f"pretrained={ckpt},rpt_iters=1.7", "gsm8k_local", "rpt_iters=1.7"),
                                       ("rpt_iters=1", "gsm8k_local", "pretrained"),
                                       (f"pretrained={ckpt}", "no_such_task", "no_such_task")):
        cmd = [sys.executable, str(ROOT / "eval" / "lm_eval.py"), "--model", "rpt", "--model_args", model_args,
               "--tasks", task, "--include_path", str(ROOT / "eval" / "lm_eval_tasks"), "--limit", "1"]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        [line] = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
        assert expected in line
