"""A compiled decode that cannot compile falls back to eager for that decode (``rpt/decode_forward/compile_guard.py``).

The failures are made on the CPU: a ``torch.compile`` backend that raises (what an inductor crash is to
dynamo), and dynamo's recompile limit lowered so that a second batch shape passes it. Truth: the eager
decode of the same inputs (the fallback restarts from the prompt), one warning naming the torch
version and the error, ``stats["compile_fallback"]``; in strict mode (``RPT_STRICT_COMPILE=1``, the
tests' default: no other test passes by falling back) the failure is raised."""

import warnings

import pytest
import torch

from rpt.decode_forward import queries
from rpt.decode_forward.compile_guard import STRICT_ENV, CompileFailure
from rpt.sampling import SamplingConfig, generate
from tests.helpers.compile_helpers import lenient, model  # noqa: F401 (pytest fixtures)
from tests.sampling.decode.test_decoder import prompts


class Broken:
    """A compile backend that raises, counting how often dynamo asked it to compile a graph."""

    def __init__(self):
        self.calls = 0

    def __call__(self, gm, example_inputs):
        self.calls += 1
        raise RuntimeError("this backend cannot compile anything")


def decode_with_warnings(model, ids, mask, cfg, compile, streamer=None):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = generate(model, ids, cfg, attention_mask=mask, compile=compile, streamer=streamer)
    return out, [w for w in seen if issubclass(w.category, RuntimeWarning)]


@pytest.mark.parametrize("rpt_iters", [0, 1])
def test_a_backend_that_raises_falls_back_to_eager_once_per_decode(model, lenient, rpt_iters):
    """NTP and RPT (k = 1, corrections at confidence 0.3), ragged rows: the eager tokens, one warning line
    naming torch's version and the backend's error, the failure in the stats; a second decode of the
    same bucket runs eagerly at once (the backend is not asked again) with the same warning."""
    ids, mask = prompts(3, seed=11)
    cfg = SamplingConfig(max_new_tokens=10, rpt_iters=rpt_iters, rpt_window=2, confidence=0.3, eos_token_id=[])
    eager = generate(model, ids, cfg, attention_mask=mask)
    backend = Broken()
    for _ in range(2):
        out, warned = decode_with_warnings(model, ids, mask, cfg, backend)
        assert torch.equal(out.sequences, eager.sequences)
        assert out.stats["forward_passes"] == eager.stats["forward_passes"]
        assert len(warned) == 1, [str(w.message) for w in warned]
        message = str(warned[0].message)
        assert "\n" not in message and f"torch {torch.__version__}" in message
        assert "this backend cannot compile anything" in message and "ran eagerly" in message
        assert "this backend cannot compile anything" in out.stats["compile_fallback"]
        assert backend.calls == 1  # the bucket remembers its failure
    assert "compile_fallback" not in eager.stats


def test_strict_mode_raises_the_failure(model, lenient, monkeypatch):
    monkeypatch.setenv(STRICT_ENV, "1")
    ids, mask = prompts(2, seed=12)
    with pytest.raises(CompileFailure, match="this backend cannot compile anything") as failure:
        generate(model, ids, SamplingConfig(max_new_tokens=6, rpt_iters=1, rpt_window=2), attention_mask=mask,
                 compile=Broken())
    assert f"torch {torch.__version__}" in str(failure.value)


def test_the_recompile_limit_is_a_fallback_not_a_silent_eager_run(model, lenient, monkeypatch):
    """Dynamo's recompile limit (lowered to 1 graph of the step): the first batch shape compiles, the
    second would be one graph too many for the step's code object: dynamo raises
    (``FailOnRecompileLimitHit``, not a frame silently run eagerly) and the decode falls back, warned
    and recorded; its tokens are the eager ones."""
    monkeypatch.setattr(queries, "COMPILED_GRAPHS", 1)
    cfg = SamplingConfig(max_new_tokens=6, rpt_iters=1, rpt_window=2, eos_token_id=[])
    outs = []
    for batch in (2, 3):
        ids, mask = prompts(batch, seed=13)
        out, warned = decode_with_warnings(model, ids, mask, cfg, "eager")
        assert torch.equal(out.sequences, generate(model, ids, cfg, attention_mask=mask).sequences)
        outs.append((out, warned))
    (first, first_warned), (second, second_warned) = outs
    assert "compile_fallback" not in first.stats and not first_warned
    assert "RecompileLimit" in second.stats["compile_fallback"] and len(second_warned) == 1


def test_a_streamer_sees_each_token_once_across_the_restart(model, lenient):
    """A streamed decode whose compiled call fails after the prompt went out: the rerun does not send the
    prompt (or any token) again; the streamer receives exactly what an eager decode sends it."""

    class Recorder:
        def __init__(self):
            self.puts, self.ends = [], 0

        def put(self, value):
            self.puts.append(value.reshape(-1).tolist())

        def end(self):
            self.ends += 1

    ids = torch.tensor([[5, 9, 14, 3]])
    cfg = SamplingConfig(max_new_tokens=8, rpt_iters=1, rpt_window=2, confidence=0.3, eos_token_id=[])
    want, got = Recorder(), Recorder()
    generate(model, ids, cfg, streamer=want)
    out, warned = decode_with_warnings(model, ids, None, cfg, Broken(), streamer=got)
    assert len(warned) == 1 and "compile_fallback" in out.stats
    assert got.puts[0] == want.puts[0] == ids[0].tolist()
    assert sum(got.puts, []) == sum(want.puts, []) and got.ends == want.ends == 1
