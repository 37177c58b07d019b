"""``eval/humaneval.py`` and ``eval/gsm8k.py`` with ``--checkpoint``: the sampling sweep, resume, bad input.

A tiny random RPT Llama and a byte-level BPE trained here stand in for a real checkpoint; its
scores are 0, so the tests check the plumbing (prompts, settings, stop strings, keys, resume),
never the pass rate.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import rpt.evaluation.humaneval as he
from rpt.evaluation import gsm8k, sweep
from rpt.model import RPTForCausalLM
from tests.helpers.scripts import ROOT, load_script
from tests.helpers.train_helpers import free_port

DATA = Path(os.environ.get("RPT_GSM8K_DIR", ROOT.parent / "shared" / "data" / "gsm8k"))
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"GSM8K data not found at {DATA}; set RPT_GSM8K_DIR")

CODE = '''from typing import List


def has_close_elements(numbers: List[float], threshold: float) -> bool:
    """ Check if in given list of numbers, are any two numbers closer to each other than
    given threshold.
    >>> has_close_elements([1.0, 2.0, 3.0], 0.5)
    False
    """
    for idx, elem in enumerate(numbers):
        for idx2, elem2 in enumerate(numbers):
            if idx != idx2:
                distance = abs(elem - elem2)
                if distance < threshold:
                    return True
    return False


def separate_paren_groups(paren_string: str) -> List[str]:
    result = []
    current_string = []
    current_depth = 0
    for c in paren_string:
        if c == '(':
            current_depth += 1
            current_string.append(c)
        elif c == ')':
            current_depth -= 1
            current_string.append(c)
            if current_depth == 0:
                result.append(''.join(current_string))
                current_string.clear()
    return result
'''
PROSE = ("Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
         "How many clips did Natalia sell altogether in April and May?\nAnswer: Natalia sold 48/2 = 24 clips in May. "
         "Natalia sold 48+24 = 72 clips altogether in April and May.\nThe answer is 72.\n\n")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> dict[str, str]:
    """``rpt``: a random RPT checkpoint (window 3, random offset table); ``plain``: its base model alone."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CODE, PROSE] * 10, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         initializer_range=0.4)
    base = LlamaForCausalLM(config).eval()
    model = RPTForCausalLM.from_base(base, window=3)
    with torch.no_grad():
        model.offset_embedding.weight.copy_(0.3 * torch.randn(model.offset_embedding.weight.shape))
    root = tmp_path_factory.mktemp("eval_ckpt")
    paths = {"rpt": root / "rpt", "plain": root / "plain"}
    model.save_pretrained(paths["rpt"])
    base.save_pretrained(paths["plain"])
    for path in paths.values():
        tokenizer.save_pretrained(path)
    return {k: str(v) for k, v in paths.items()}


@pytest.fixture(scope="module")
def scripts():
    return {"humaneval": load_script("eval/humaneval.py"), "gsm8k": load_script("eval/gsm8k.py")}


@pytest.fixture
def calls(monkeypatch) -> list[tuple[list[str], object]]:
    """Every ``generate_texts`` call the sweep makes: ``(prompts, config)``."""
    seen = []
    real = sweep.generate_texts

    def spy(model, tokenizer, prompts, config, *args, **kwargs):
        seen.append((list(prompts), config))
        return real(model, tokenizer, prompts, config, *args, **kwargs)

    monkeypatch.setattr(sweep, "generate_texts", spy)
    return seen


def n_prompts(calls) -> int:
    return sum(len(prompts) for prompts, _ in calls)


def test_humaneval_checkpoint_sweep_and_resume(scripts, ckpt, calls, tmp_path):
    out = tmp_path / "he.json"
    argv = ["--checkpoint", ckpt["rpt"], "--limit", "2", "--rpt-iters", "0", "1", "--max-new-tokens", "16",
            "--out", str(out)]
    assert scripts["humaneval"].main(argv) == 0
    summary = json.loads(out.read_text())
    problems = he.load_problems()
    tasks = list(problems)[:2]

    # one greedy completion per task and setting, from the problem's prompt, with the sampler the flags ask for
    assert n_prompts(calls) == 4
    assert [sorted(p) for p, _ in calls] == [sorted(problems[t]["prompt"] for t in tasks)] * 2
    assert [c.rpt_iters for _, c in calls] == [0, 1]
    assert all(c.temperature == 0 and c.max_new_tokens == 16 and c.token_healing for _, c in calls)
    assert all(set(he.STOP_SEQUENCES) <= set(c.stop) for _, c in calls)

    assert {"n_problems", "pass@1", "results", "settings", "best_of_temperatures", "checkpoint"} <= set(summary)
    assert summary["n_problems"] == 2 and summary["n_samples"] == 2
    assert [(s["rpt_iters"], s["temperature"]) for s in summary["settings"]] == [(0, 0.0), (1, 0.0)]
    for s in summary["settings"]:
        assert {"pass@1", "tokens_per_s", "corrections", "results"} <= set(s)
        assert s["tokens_per_s"] > 0 and s["new_tokens"] > 0
        assert [r["task_id"] for r in s["results"]] == tasks
        for r in s["results"]:
            assert {"task_id", "completion", "passed", "result"} <= set(r)
            assert r["completion"] == he.truncate_completion(r["completion"])  # cut at the end of the function
    assert summary["pass@1"] == summary["settings"][0]["pass@1"]
    assert summary["results"] == summary["settings"][0]["results"]
    assert set(summary["best_of_temperatures"]) == {"0", "1"}
    assert out.with_suffix(".md").read_text().count("\n| 1 | 0 |") == 2  # the settings row and the best-of row
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"

    # rerun on the same --out: nothing is generated or executed again (the store gains no line), the
    # report is the same
    items = sibling_items(out).read_bytes()
    assert scripts["humaneval"].main(argv) == 0
    assert n_prompts(calls) == 4
    assert sibling_items(out).read_bytes() == items
    assert json.loads(out.read_text()) == summary

    # a new temperature: only its settings are generated, the first ones come from the store
    assert scripts["humaneval"].main([*argv, "--temperatures", "0", "0.5"]) == 0
    assert n_prompts(calls) == 8 and [c.temperature for _, c in calls[2:]] == [0.5, 0.5]
    wider = json.loads(out.read_text())
    assert [(s["rpt_iters"], s["temperature"]) for s in wider["settings"]] == [(0, 0.0), (0, 0.5), (1, 0.0), (1, 0.5)]
    assert wider["settings"][0]["results"] == summary["settings"][0]["results"]


def sibling_items(out: Path) -> Path:
    return out.with_name(out.stem + ".items.jsonl")


def test_humaneval_samples_per_task(scripts, ckpt, calls, tmp_path):
    out = tmp_path / "he.json"
    argv = ["--checkpoint", ckpt["rpt"], "--limit", "1", "--n-samples", "2", "--k", "1", "2", "--temperatures", "0",
            "1.0", "--seed", "0", "--batch-size", "1", "--max-new-tokens", "16", "--no-token-healing", "--out", str(out)]
    assert scripts["humaneval"].main(argv) == 0
    summary = json.loads(out.read_text())
    assert all(not c.token_healing for _, c in calls)
    # greedy: one decode serves both samples; T = 1: two decodes, seeded per sample so they differ
    assert n_prompts(calls) == 3
    greedy, sampled = summary["settings"]
    assert [r["sample"] for r in greedy["results"]] == [0, 1] and [r["sample"] for r in sampled["results"]] == [0, 1]
    assert greedy["results"][0]["completion"] == greedy["results"][1]["completion"]
    assert sampled["results"][0]["completion"] != sampled["results"][1]["completion"]
    assert {"pass@1", "pass@2"} <= set(summary) and {"pass@1", "pass@2"} <= set(sampled)
    assert summary["samples_per_task"] == 2 and summary["n_problems"] == 1 and summary["n_samples"] == 2


def test_sampled_completions_do_not_depend_on_batch_size(scripts, ckpt, tmp_path):
    """Each (problem, sample, setting) is keyed by itself, not by its batch (no --seed: seed 0)."""
    runs = {}
    for size in (1, 4):
        out = tmp_path / f"he{size}.json"
        argv = ["--checkpoint", ckpt["rpt"], "--limit", "4", "--n-samples", "2", "--temperatures", "0.8",
                "--rpt-iters", "1", "--batch-size", str(size), "--max-new-tokens", "8", "--no-token-healing",
                "--out", str(out)]
        assert scripts["humaneval"].main(argv) == 0
        (setting,) = json.loads(out.read_text())["settings"]
        runs[size] = [(r["task_id"], r["sample"], r["completion"]) for r in setting["results"]]
    assert runs[1] == runs[4]
    assert len(runs[1]) == 8 and len({c for _, _, c in runs[1]}) > 4  # sampled: mostly distinct completions


@needs_data
def test_gsm8k_checkpoint_sweep_and_resume(scripts, ckpt, calls, tmp_path):
    out = tmp_path / "gsm8k.json"
    argv = ["--checkpoint", ckpt["rpt"], "--data", str(DATA / "test.jsonl"), "--limit", "2", "--shots", "1",
            "--rpt-iters", "0", "1", "--max-new-tokens", "16", "--out", str(out)]
    assert scripts["gsm8k"].main(argv) == 0
    summary = json.loads(out.read_text())
    test = gsm8k.load_gsm8k(DATA / "test.jsonl")[:2]
    prefix = gsm8k.fewshot_prefix(gsm8k.load_gsm8k(DATA / "train.jsonl"), 1)  # the train split beside --data

    assert n_prompts(calls) == 4
    assert [sorted(p) for p, _ in calls] == [sorted(gsm8k.build_prompt(prefix, q["question"]) for q in test)] * 2
    assert all("Question:" in c.stop and c.max_new_tokens == 16 for _, c in calls)

    assert {"n", "accuracy", "results", "settings", "best_of_temperatures"} <= set(summary)
    assert summary["n"] == 2 and summary["shots"] == 1
    assert [(s["rpt_iters"], s["temperature"]) for s in summary["settings"]] == [(0, 0.0), (1, 0.0)]
    for s in summary["settings"]:
        assert {"accuracy", "tokens_per_s", "corrections", "results"} <= set(s)
        assert [r["idx"] for r in s["results"]] == [0, 1]
        assert [r["gold"] for r in s["results"]] == [gsm8k.gold_answer(p["answer"]) for p in test]
        for r in s["results"]:
            assert {"idx", "prediction", "gold", "correct", "completion"} <= set(r)
            assert r["prediction"] == gsm8k.extract_answer(r["completion"]) and "Question:" not in r["completion"]
    assert summary["accuracy"] == summary["settings"][0]["accuracy"]
    assert summary["results"] == summary["settings"][0]["results"]
    assert set(summary["best_of_temperatures"]) == {"0", "1"}
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG" and "| rpt_iters |" in out.with_suffix(".md").read_text()

    items = sibling_items(out).read_bytes()
    assert scripts["gsm8k"].main(argv) == 0
    assert n_prompts(calls) == 4 and sibling_items(out).read_bytes() == items
    assert json.loads(out.read_text()) == summary
    # --fresh forgets the stored answers
    assert scripts["gsm8k"].main([*argv, "--fresh"]) == 0
    assert n_prompts(calls) == 8


@needs_data
def test_stored_generations_are_not_reused_for_another_dtype_or_retrained_weights(scripts, ckpt, calls, tmp_path):
    """The resume key holds what a completion depends on beyond the path: the weights' dtype, and
    the checkpoint's files (a checkpoint rewritten in place is another model)."""
    import shutil

    copy = tmp_path / "ckpt"
    shutil.copytree(ckpt["rpt"], copy)
    argv = ["--checkpoint", str(copy), "--data", str(DATA / "test.jsonl"), "--limit", "2", "--shots", "1",
            "--rpt-iters", "0", "--max-new-tokens", "4", "--out", str(tmp_path / "g.json")]
    assert scripts["gsm8k"].main(argv) == 0 and n_prompts(calls) == 2
    assert scripts["gsm8k"].main(argv) == 0 and n_prompts(calls) == 2  # same weights: resumed
    assert scripts["gsm8k"].main([*argv, "--dtype", "bfloat16"]) == 0 and n_prompts(calls) == 4
    weights = copy / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))  # rewritten in place
    assert scripts["gsm8k"].main(argv) == 0 and n_prompts(calls) == 6


@needs_data
def test_stored_generations_follow_the_hub_snapshot_the_cache_holds(scripts, ckpt, calls, tmp_path, monkeypatch):
    """A hub id updated in the local cache to another snapshot (other weights): the rerun on the same
    --out generates anew, keyed by the snapshot's commit and files, not by the name."""
    import shutil

    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    repo = tmp_path / "hub" / "models--org--tiny-rpt"

    def publish(commit: str, scale: float) -> None:
        snapshot = repo / "snapshots" / commit
        shutil.copytree(ckpt["rpt"], snapshot)
        if scale != 1.0:  # other weights under the same name
            model = RPTForCausalLM.from_pretrained(ckpt["rpt"])
            with torch.no_grad():
                model.offset_embedding.weight.mul_(scale)
            model.save_pretrained(snapshot)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(commit)

    publish("a" * 40, 1.0)
    assert sweep.hub_snapshot("org/tiny-rpt") == str(repo / "snapshots" / ("a" * 40))
    argv = ["--checkpoint", "org/tiny-rpt", "--data", str(DATA / "test.jsonl"), "--limit", "2", "--shots", "1",
            "--rpt-iters", "1", "--max-new-tokens", "4", "--out", str(tmp_path / "g.json")]
    assert scripts["gsm8k"].main(argv) == 0 and n_prompts(calls) == 2
    model = RPTForCausalLM.from_pretrained(str(repo / "snapshots" / ("a" * 40)))
    key = sweep.weights_fingerprint("org/tiny-rpt", model)
    assert sweep.weights_fingerprint("org/tiny-rpt", model) == key  # the same snapshot: the same key, resumed
    from rpt.studies.error_analysis.run import checkpoint_fingerprint

    first = checkpoint_fingerprint("org/tiny-rpt")  # the error analysis's resume key follows the snapshot too
    assert first == checkpoint_fingerprint("org/tiny-rpt") and "a" * 40 in first[0]
    publish("b" * 40, 3.0)
    assert sweep.weights_fingerprint("org/tiny-rpt", model) != key
    assert scripts["gsm8k"].main(argv) == 0 and n_prompts(calls) == 4  # another snapshot: generated anew
    assert checkpoint_fingerprint("org/tiny-rpt") != first
    assert sweep.hub_snapshot(str(tmp_path / "nowhere")) is None and sweep.hub_snapshot("not a repo id!") is None


@needs_data
def test_compiled_eager_and_fallback_completions_are_recorded_and_kept_apart(scripts, ckpt, calls, tmp_path,
                                                                             monkeypatch, capsys):
    """Every stored completion records the decode that made it (``compiled``, ``eager``, ``fallback``); a run
    resumed with another ``--compile`` generates anew instead of mixing the two, each kind resuming its
    own; completions a compile failure made eagerly are counted in the report and said in one line. (The
    scripts' ``--compile`` is inductor: here the decode's backend is swapped for dynamo's ``eager``, or
    for one that raises.)"""
    from rpt.decode_forward.compile_guard import STRICT_ENV
    from rpt.sampling.text import complete as texts
    from tests.decode_forward.test_compile_fallback import Broken

    backend, real = {"compile": "eager"}, texts.generate
    monkeypatch.setattr(texts, "generate", lambda *a, compile=False, **k: real(
        *a, compile=backend["compile"] if compile else False, **k))
    out = tmp_path / "g.json"
    argv = ["--checkpoint", ckpt["rpt"], "--data", str(DATA / "test.jsonl"), "--limit", "2", "--shots", "1",
            "--rpt-iters", "0", "--max-new-tokens", "3", "--out", str(out)]

    def decoded_by():
        return json.loads(out.read_text())["settings"][0]["decoded_by"]

    assert scripts["gsm8k"].main(argv) == 0 and n_prompts(calls) == 2 and decoded_by() == {"eager": 2}
    assert scripts["gsm8k"].main([*argv, "--compile"]) == 0 and n_prompts(calls) == 4  # not the eager ones
    assert decoded_by() == {"compiled": 2}
    assert scripts["gsm8k"].main(argv) == 0 and n_prompts(calls) == 4 and decoded_by() == {"eager": 2}  # resumed
    assert "compile failure" not in capsys.readouterr().out
    monkeypatch.setenv(STRICT_ENV, "0")
    backend["compile"] = Broken()
    with pytest.warns(RuntimeWarning, match="ran eagerly"):
        assert scripts["gsm8k"].main([*argv, "--compile", "--fresh"]) == 0
    assert n_prompts(calls) == 6 and decoded_by() == {"fallback": 2}
    lines = [line for line in capsys.readouterr().out.splitlines() if "compile failure" in line]
    assert lines == ["note: rpt0_t0: 2 of 2 completions were decoded eagerly after a compile failure "
                     "(compile_fallback; their tokens/s are eager ones)"]
    stored = [json.loads(line)["record"] for line in sibling_items(out).read_text().splitlines()]
    assert {r["batch"]["path"] for r in stored if "batch" in r} == {"fallback"}


def test_an_eager_completion_keeps_the_key_it_had():
    """Stores written before completions recorded their decode resume as before: an eager key is unchanged
    (the spec of 9fbd713), a compiled one differs."""
    import hashlib

    from rpt.sampling import SamplingConfig

    config = SamplingConfig(max_new_tokens=4)
    spec = json.dumps({"checkpoint": "hub/model", "weights": "w", "config": dataclasses.asdict(config), "item": 3,
                       "sample": 0, "prompt": "p"}, sort_keys=True, default=str)
    before = f"gen:3:0:{hashlib.sha1(spec.encode()).hexdigest()[:20]}"
    assert sweep.generation_key("hub/model", config, 3, 0, "p", "w") == before
    assert sweep.generation_key("hub/model", config, 3, 0, "p", "w", compile=True) != before


@needs_data
def test_plain_checkpoint_runs_without_rpt(scripts, ckpt, calls, tmp_path):
    out = tmp_path / "g.json"
    assert scripts["gsm8k"].main(["--checkpoint", ckpt["plain"], "--data", str(DATA / "test.jsonl"), "--limit", "1",
                                  "--shots", "0", "--max-new-tokens", "4", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["n"] == 1 and n_prompts(calls) == 1


@needs_data
def test_gsm8k_splits_items_across_two_processes(scripts, ckpt, tmp_path):
    """``accelerate launch`` with 2 CPU (gloo) processes: each generates its share, one output in input order."""
    pytest.importorskip("accelerate")
    argv = ["--checkpoint", ckpt["rpt"], "--data", str(DATA / "test.jsonl"), "--limit", "3", "--shots", "1",
            "--rpt-iters", "0", "1", "--max-new-tokens", "8"]
    single = tmp_path / "single.json"
    assert scripts["gsm8k"].main([*argv, "--out", str(single)]) == 0
    out = tmp_path / "ddp.json"
    accelerate = os.path.join(os.path.dirname(sys.executable), "accelerate")
    cmd = [accelerate, "launch", "--config_file", str(ROOT / "configs/accelerate/cpu_ddp.yaml"),
           "--main_process_port", str(free_port()), str(ROOT / "eval" / "gsm8k.py"), *argv, "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE", HF_HUB_OFFLINE="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ddp, ref = json.loads(out.read_text()), json.loads(single.read_text())
    # every answer generated once (by one of the processes), none twice
    lines = [json.loads(line) for line in sibling_items(out).read_text().splitlines()]
    assert len(lines) == 2 * 3 and len({line["id"] for line in lines}) == 6
    assert len({line["record"]["batch"]["id"] for line in lines}) == 4  # shares of 2 and 1 items per setting
    for a, b in zip(ddp["settings"], ref["settings"]):
        assert [(r["idx"], r["completion"]) for r in a["results"]] == [(r["idx"], r["completion"]) for r in b["results"]]


@pytest.mark.parametrize("name", ["humaneval", "gsm8k"])
@pytest.mark.parametrize("case, extra, message", [
    ("missing", ["--checkpoint", "{missing}"], "does not exist"),
    ("plain_rpt", ["--checkpoint", "{plain}", "--rpt-iters", "0", "1"], "not an RPT checkpoint"),
    ("window", ["--checkpoint", "{rpt}", "--rpt-iters", "1", "--rpt-window", "4"], "larger than the window"),
    ("temperature", ["--checkpoint", "{rpt}", "--temperatures", "0", "-0.1"], "--temperatures -0.1"),
    ("top_p", ["--checkpoint", "{rpt}", "--top-p", "0"], "top_p"),
])
def test_bad_input_is_one_error_and_status_2(scripts, ckpt, calls, tmp_path, capsys, name, case, extra, message):
    if name == "gsm8k" and not DATA.is_dir():
        pytest.skip(f"GSM8K data not found at {DATA}")
    out = tmp_path / "o.json"
    paths = {"missing": str(tmp_path / "nope"), "plain": ckpt["plain"], "rpt": ckpt["rpt"]}
    argv = [a.format(**paths) for a in extra] + ["--limit", "1", "--max-new-tokens", "4", "--out", str(out)]
    if name == "gsm8k":
        argv += ["--data", str(DATA / "test.jsonl"), "--shots", "0"]
    assert scripts[name].main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
    assert not out.exists() and calls == []


@pytest.mark.parametrize("name, completions", [("humaneval", "canonical"), ("gsm8k", "gold")])
def test_checkpoint_and_completions_are_mutually_exclusive(scripts, ckpt, tmp_path, capsys, name, completions):
    for argv in (["--checkpoint", ckpt["rpt"], "--completions", completions], []):
        with pytest.raises(SystemExit) as exc:
            scripts[name].main([*argv, "--out", str(tmp_path / "o.json")])
        assert exc.value.code == 2
        assert "exactly one of --checkpoint" in capsys.readouterr().err


def test_sweep_settings_and_best_of_temperatures():
    settings = sweep.sweep_settings([0, 1, 0], [0.0, 0.1])
    assert [(s.rpt_iters, s.temperature) for s in settings] == [(0, 0.0), (0, 0.1), (1, 0.0), (1, 0.1)]
    rows = [{**s.as_dict(), "acc": a} for s, a in zip(settings, [0.2, 0.3, 0.5, 0.4])]
    assert sweep.best_of_temperatures(rows, "acc") == {
        "0": {"rpt_iters": 0, "temperature": 0.1, "acc": 0.3}, "1": {"rpt_iters": 1, "temperature": 0.0, "acc": 0.5}}
    with pytest.raises(ValueError):
        sweep.sweep_settings([-1], [0.0])
