"""Every decode path of ``generate`` gives the same tokens: several compiled NTP steps per host read, and
a ``flex_attention`` model on every path (eager, compiled, multi-step; per-row and batch-flat RPT).

Truths: the eager decoder and the uncached reference (multi-step), and the same weights loaded with
sdpa (flex attention). The multi-step paths trace with ``aot_eager`` (as ``test_compiled_ntp.py``), the
flex ones with dynamo's ``eager``."""

import random

import pytest
import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from rpt.decode_forward import llama_forward as decode_model
from rpt.sampling import SamplingConfig, generate, generate_reference
from rpt.sampling.decode import compile_mode as step_compile
from tests.sampling.decode.test_compiled_ntp import random_config
from tests.sampling.decode.test_decoder import V, prompts, rpt_model


@pytest.fixture(scope="module")
def model():
    return rpt_model(2).float()


class Reads:
    """Counts the reads of a step's flags (``tolist`` of the state's ``[2]`` bool tensor)."""

    def __init__(self, monkeypatch):
        self.count = 0
        real = torch.Tensor.tolist

        def counted(t, *args):
            self.count += t.dtype == torch.bool and tuple(t.shape) == (2,)
            return real(t, *args)

        monkeypatch.setattr(torch.Tensor, "tolist", counted)


@pytest.mark.parametrize("case", range(4))
def test_several_compiled_steps_per_read_equal_eager_and_reference(model, monkeypatch, case):
    """NTP with 3 or 5 compiled steps between two reads of the flags (what CUDA runs): greedy or seeded
    sampling, every penalty and LZ at random, ragged rows, one row stopping at EOS mid-run while the
    others go on (finished rows are fed pad ids on the device): the eager and reference tokens and
    finish reasons, and about one read per run of steps."""
    rng = random.Random(case)
    per_read = rng.choice([3, 5])
    monkeypatch.setitem(step_compile.STEPS_PER_TRANSFER, "cpu", per_read)
    ids, mask = prompts(3, lengths=rng.choice([(9, 5, 7), (6, 6, 6)]), seed=40 + case)
    new = rng.choice([11, 17])
    free = random_config(random.Random(case), max_new_tokens=new, eos_token_id=[])
    eos = generate(model, ids, free, attention_mask=mask).generated(0)[rng.randrange(2, 6)]
    cfg = random_config(random.Random(case), max_new_tokens=new, eos_token_id=eos)
    eager = generate(model, ids, cfg, attention_mask=mask)
    reads = Reads(monkeypatch)
    # aot_eager's functionalisation for cases 0 (sampled) and 1 (greedy), whose processors include those of
    # cases 2 and 3 (greedy); these trace with dynamo's eager backend (the same graph, half the cost)
    backend = "aot_eager" if case < 2 else "eager"
    compiled = generate(model, ids, cfg, attention_mask=mask, compile=backend)
    monkeypatch.undo()
    ref = generate_reference(model, ids, cfg, attention_mask=mask)
    assert torch.equal(compiled.sequences, eager.sequences) and torch.equal(compiled.sequences, ref.sequences), cfg
    assert compiled.finish_reasons == eager.finish_reasons and "eos" in compiled.finish_reasons
    steps = max(compiled.new_token_counts) - 1  # after the prefill's
    assert reads.count <= -(-steps // per_read) + 1, (reads.count, steps)  # + the prefill's


def flex_available() -> bool:
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return "flex_attention" in ALL_ATTENTION_FUNCTIONS


# the compiled paths trace with dynamo's eager backend: the question is which attention runs, and the
# steps' functionalisation (aot_eager) is test_compiled_ntp.py's and test_compiled_rpt.py's
PATHS = {  # name: (config, compile, NTP steps per read)
    "ntp eager": (dict(rpt_iters=0), False, 1),
    "ntp compiled": (dict(rpt_iters=0, repetition_penalty=1.3, lz_penalty=0.5, lz_window=16), "eager", 1),
    "ntp multi-step": (dict(rpt_iters=0, temperature=0.9, top_k=8, seed=2), "eager", 4),
    "rpt per-row": (dict(rpt_iters=2, rpt_window=2, confidence=0.1, temperature=1.0, ptp_greedy=False, seed=3),
                    False, 1),
    "rpt flat": (dict(rpt_iters=1, rpt_window=2, confidence=0.3), False, 1),
    "rpt compiled": (dict(rpt_iters=1, rpt_window=2, confidence=0.3, lz_penalty=0.5, lz_window=16), "eager", 1),
    "rpt compiled sampled": (dict(rpt_iters=1, rpt_window=2, confidence=0.2, temperature=0.9, seed=5), "eager", 1),
}


@pytest.mark.skipif(not flex_available(), reason="flex_attention is not available in this torch / transformers")
@pytest.mark.parametrize("path", [pytest.param("ntp eager", marks=pytest.mark.slow)] + list(PATHS)[1:])
def test_flex_attention_gives_sdpas_tokens_on_every_path(monkeypatch, path):
    """The same weights with ``attn_implementation="flex_attention"`` and with sdpa give the same tokens on
    every path. Calls with a custom mask (every call of a padded batch, every compiled step, every PTP
    chain) run with sdpa and never reach flex; plain calls (the eager NTP steps of unpadded rows) run on
    flex's own kernel, which must have run there (slow: flex compiles its CPU kernel per cache length,
    about a minute). float32: flex attention on the CPU takes no float64."""
    knobs, compile, per_read = PATHS[path]
    monkeypatch.setitem(step_compile.STEPS_PER_TRANSFER, "cpu", per_read)
    monkeypatch.setattr(decode_model, "ARCHITECTURES", {})  # the model's own forward (the fused call attends by itself)
    flex_calls = []
    real = ALL_ATTENTION_FUNCTIONS["flex_attention"]
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, "flex_attention",
                        lambda *args, **kw: flex_calls.append(1) or real(*args, **kw))
    plain = path == "ntp eager"
    if plain:  # unpadded rows: the NTP steps after the prefill carry no mask
        ids, mask = torch.randint(0, V, (2, 6), generator=torch.Generator().manual_seed(8)), None
    else:  # ragged rows: every call carries a custom mask
        ids, mask = prompts(2, lengths=(6, 4), seed=8)
    cfg = SamplingConfig(max_new_tokens=8, eos_token_id=[], **knobs)
    sdpa = generate(rpt_model(2).float(), ids, cfg, attention_mask=mask).sequences
    flex = rpt_model(2).float()
    flex.lm.config._attn_implementation = "flex_attention"
    got = generate(flex, ids, cfg, attention_mask=mask, compile=compile)
    assert torch.equal(got.sequences, sdpa)
    assert flex.lm.config._attn_implementation == "flex_attention"  # switched for the masked calls and back
    assert bool(flex_calls) == plain  # the mask-free steps, and only they, ran on the model's own kernel


@pytest.fixture(scope="module")
def windows():
    return {w: rpt_model(w) for w in (2, 3)}


def check_compiled_case(windows, monkeypatch, case: int) -> None:
    """``test_decoder``'s random point of the knob space (temperature, top-k/p, min-p, every penalty, LZ,
    penalize_ptp, w, k, EOS, ragged rows), compiled (dynamo's ``eager`` backend: the same traced steps
    as inductor, exact kernels); every other case as plain NTP with 3 compiled steps per read."""
    from tests.sampling.decode.test_decoder import random_config as knob_space

    rng = random.Random(1000 + case)
    knobs = knob_space(rng)
    if case % 2:
        knobs["rpt_iters"] = 0
        monkeypatch.setitem(step_compile.STEPS_PER_TRANSFER, "cpu", 3)
    cfg = SamplingConfig(**{**knobs, "max_new_tokens": 12})
    ids, mask = prompts(3, lengths=tuple(rng.randint(3, 9) for _ in range(3)), seed=case)
    model = windows[cfg.rpt_window]
    eager = generate(model, ids, cfg, attention_mask=mask)
    compiled = generate(model, ids, cfg, attention_mask=mask, compile="eager")
    ref = generate_reference(model, ids, cfg, attention_mask=mask)
    assert torch.equal(compiled.sequences, eager.sequences) and torch.equal(compiled.sequences, ref.sequences), cfg
    assert compiled.finish_reasons == eager.finish_reasons == ref.finish_reasons
    assert compiled.stats["corrections"] == eager.stats["corrections"] == ref.stats["corrections"]


@pytest.mark.slow
@pytest.mark.parametrize("case", range(24))
def test_compiled_decodes_over_the_knob_space_equal_eager_and_reference(windows, monkeypatch, case):
    """Slow: each case traces its own steps (15-40 s on 2 shared cores); the default suite's compiled
    cases are in test_compiled_ntp.py, test_compiled_rpt.py and the multi-step test above."""
    check_compiled_case(windows, monkeypatch, case)
