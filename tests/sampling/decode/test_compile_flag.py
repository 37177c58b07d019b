"""``--compile`` on every entry point that decodes: off by default (scores do not move), and when given it
reaches :func:`rpt.sampling.generate` as ``compile=True``. The decodes themselves are recorded, not run
(compiled decoding is tested in ``test_compiled_*.py`` / ``test_decode_*.py``)."""

import pytest
import torch

from rpt.evaluation import batched_generation as generation
from rpt.evaluation import benchmark_script as script
from rpt.evaluation import table1
from rpt.evaluation.code_benchmarks import HumanEval, MBPPPlus
from rpt.evaluation.gsm8k import GSM8K
from rpt.sampling import SamplingConfig
from rpt.sampling.text import complete as texts
from tests.helpers.scripts import load_script
from tests.sampling.decode.test_decoder import rpt_model

PARSERS = {
    "sample.py": lambda: load_script("sample.py").build_parser(),
    "eval/gsm8k.py": lambda: script.build_parser(GSM8K("")),
    "eval/humaneval.py": lambda: script.build_parser(HumanEval("")),
    "eval/mbpp.py": lambda: script.build_parser(MBPPPlus("")),
    "eval/repetition.py": lambda: load_script("eval/repetition.py").build_parser(),
    "eval/table1.py": lambda: load_script("eval/table1.py").build_parser(),
}
NEEDED = {"sample.py": ["--checkpoint", "c", "--prompt", "p"], "eval/repetition.py": ["--checkpoint", "c"], "eval/table1.py": ["--checkpoint", "c"]}


@pytest.mark.parametrize("entry", list(PARSERS))
def test_every_decoding_script_takes_compile_off_by_default(entry):
    parser = PARSERS[entry]()
    base = NEEDED.get(entry, ["--checkpoint", "c"])
    assert parser.parse_args(base).compile is False
    assert parser.parse_args([*base, "--compile"]).compile is True


class Recorded:
    def __init__(self, monkeypatch, module, name="generate"):
        self.compile = []
        real = getattr(module, name)

        def recording(*args, compile=False, **kwargs):
            self.compile.append(compile)
            return real(*args, compile=False, **kwargs)  # the decode itself eagerly: the flag is the subject

        monkeypatch.setattr(module, name, recording)


def test_generate_texts_and_the_sweep_pass_compile_through(monkeypatch):
    """The evaluation scripts' decoding helper hands ``compile`` to ``generate``, and only when asked."""
    from tests.helpers.tiny_models import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    model = rpt_model(2)
    model.lm.resize_token_embeddings(len(tokenizer))
    calls = Recorded(monkeypatch, texts)
    cfg = SamplingConfig(max_new_tokens=2, rpt_iters=1, rpt_window=2)
    for flag in (False, True):
        generation.generate_texts(model, tokenizer, ["def f(", "x = "], cfg, batch_size=2, compile=flag)
    assert calls.compile == [False, True]


def test_table1_forwards_compile_to_each_benchmark_run():
    args = load_script("eval/table1.py").build_parser().parse_args(["--checkpoint", "c", "--compile"])
    run = table1.plan([2], [1], ["gsm8k"])[0]
    assert "--compile" in table1.argv_for(run, args)
    args.compile = False
    assert "--compile" not in table1.argv_for(run, args)


def test_custom_generate_and_lm_eval_take_compile(monkeypatch, tmp_path):
    """``model.generate(custom_generate=..., compile=True)`` (rpt.hf_generate) and lm-eval's
    ``model_args=...,compile=true`` reach ``generate(compile=True)``; both default to off."""
    from transformers import AutoModelForCausalLM

    from rpt import hf_generate
    from rpt.evaluation.lm_eval_adapter import RPTLM
    from rpt.sampling.decode import generate as fast_decoder
    from tests.helpers.tiny_models import save_tiny_checkpoint

    ckpt = save_tiny_checkpoint(tmp_path / "ckpt")
    calls = Recorded(monkeypatch, fast_decoder)
    monkeypatch.setattr(hf_generate, "rpt_generate", fast_decoder.generate)  # the name hf_generate bound at import
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    ids = torch.tensor([[5, 6, 7]])
    for extra in ({}, {"compile": True}):
        hf_generate.generate(model, ids, rpt_iters=1, rpt_window=3, max_new_tokens=2, rpt_checkpoint=ckpt, **extra)
    assert calls.compile == [False, True]
    assert RPTLM(ckpt).compile is False and RPTLM(ckpt, compile="true").compile is True
