"""A compiled decode's bad inputs are input errors, a compile failure's fallback lasts only as long as its
cause, and a user's dynamo settings do not break it (``rpt/decode_forward/compile_guard.py``,
``rpt/sampling/decode/buffers.py``, ``rpt/sampling/prompts.py``, ``rpt/sampling/config.py``).

Truths: the eager decode of the same inputs; a compile backend that counts what dynamo asks of it (asked
nothing: the input was refused before any compile); hand-written bounds.
"""

import dataclasses
import warnings

import pytest
import torch

from rpt.sampling import SamplingConfig, generate, generate_reference
from rpt.sampling.config import MAX_PROPOSALS_PER_TOKEN
from rpt.sampling.decode.buffers import release_decode_buffers
from tests.helpers.compile_helpers import lenient, model  # noqa: F401 (pytest fixtures)
from tests.sampling.decode.test_decoder import V, prompts


class Counting:
    """A compile backend that runs each graph as traced (dynamo's eager) and counts the graphs it was given;
    ``fail`` graphs raise first (a compile failure that lasts, or passes)."""

    def __init__(self, fail: int = 0):
        self.calls, self.fail = 0, fail

    def __call__(self, gm, example_inputs):
        self.calls += 1
        if self.fail:
            self.fail -= 1
            raise RuntimeError("this backend failed this time")
        return gm.forward


def decode(model, ids, mask, cfg, compile):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = generate(model, ids, cfg, attention_mask=mask, compile=compile)
    return out, [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]


CFG = SamplingConfig(max_new_tokens=4, rpt_iters=1, rpt_window=2, confidence=0.3, eos_token_id=[])
NTP = SamplingConfig(max_new_tokens=3, eos_token_id=[])


def test_a_token_id_outside_the_vocabulary_is_one_line_before_any_model_call(model, lenient):
    """An id at the vocabulary's size, far past it, or negative (in a ragged batch, in a real column):
    one ``ValueError`` line naming the place, the id, the vocabulary and the fix -- from the eager, the
    compiled and the reference decoders alike, with nothing compiled (the backend was never asked) -- and
    the next valid compiled decode of the same bucket compiles and runs compiled (no fallback, no warning)."""
    ids, mask = prompts(3, (6, 4, 5), seed=2)
    backend = Counting()
    for bad in (V, 10**6, -1):
        bad_ids = ids.clone()
        bad_ids[1, 3] = bad
        for run in (lambda b=bad_ids: generate(model, b, NTP, attention_mask=mask),
                    lambda b=bad_ids: generate(model, b, NTP, attention_mask=mask, compile=backend),
                    lambda b=bad_ids: generate_reference(model, b, CFG, attention_mask=mask)):
            with pytest.raises(ValueError) as error:
                run()
            message = str(error.value)
            assert "\n" not in message and f"input_ids[1, 3] = {bad}" in message and f"vocabulary of {V}" in message
    assert backend.calls == 0
    out, warned = decode(model, ids, mask, NTP, backend)
    assert torch.equal(out.sequences, generate(model, ids, NTP, attention_mask=mask).sequences)
    assert "compile_fallback" not in out.stats and not warned and backend.calls > 0


def test_a_padding_column_may_hold_any_id(model, lenient):
    """Only the real tokens are checked: a left-padding column (mask 0) holding -100 decodes as with 0 there."""
    ids, mask = prompts(2, (6, 3), seed=4)
    padded = ids.clone()
    padded[1, :3] = -100
    assert torch.equal(generate(model, padded, CFG, attention_mask=mask).sequences[:, 6:],
                       generate(model, ids, CFG, attention_mask=mask).sequences[:, 6:])


def test_a_fallback_does_not_outlive_its_cause(model, lenient):
    """A backend that fails once, then compiles: the failed decode falls back (warned), the next decode of
    the same cause runs eagerly at once (warned), the one after compiles again and runs compiled, with the
    eager tokens throughout. A backend that always fails is asked again after 1 decode, then not for the
    next 2 (a doubling backoff), and at once for another sampling config (another cause)."""
    ids, mask = prompts(2, seed=5)
    eager = generate(model, ids, NTP, attention_mask=mask).sequences
    transient = Counting(fail=1)
    fallbacks = []
    for _ in range(3):
        out, warned = decode(model, ids, mask, NTP, transient)
        assert torch.equal(out.sequences, eager)
        fallbacks.append(("compile_fallback" in out.stats, len(warned)))
    assert fallbacks == [(True, 1), (True, 1), (False, 0)]
    release_decode_buffers(model)
    lasting = Counting(fail=10**6)
    asked = []
    for _ in range(4):
        out, _ = decode(model, ids, mask, NTP, lasting)
        assert "compile_fallback" in out.stats and torch.equal(out.sequences, eager)
        asked.append(lasting.calls)
    assert asked == [1, 1, 2, 2]  # decodes 1, 3 compile, then 6, 10, ...: skips of 1, 2, 4
    sampled = dataclasses.replace(NTP, temperature=0.7, seed=1)  # another graph: tried at once
    out, _ = decode(model, ids, mask, sampled, lasting)
    assert lasting.calls == 3 and "compile_fallback" in out.stats


def test_a_users_suppress_errors_does_not_break_compiled_decodes(model, lenient):
    """``torch._dynamo.config.suppress_errors = True`` (a notebook's habit): a compiled decode runs compiled
    with the eager tokens (no fallback, no warning), a failing compile still falls back warned (not silently
    eagerly), and the user's setting is as they left it."""
    config = torch._dynamo.config
    before = config.suppress_errors
    config.suppress_errors = True  # set directly: pytest's monkeypatch deletes a torch config entry on undo
    try:
        ids, mask = prompts(2, seed=6)
        eager = generate(model, ids, NTP, attention_mask=mask).sequences
        out, warned = decode(model, ids, mask, NTP, "eager")
        assert torch.equal(out.sequences, eager) and "compile_fallback" not in out.stats and not warned
        release_decode_buffers(model)
        out, warned = decode(model, ids, mask, NTP, Counting(fail=10**6))
        assert torch.equal(out.sequences, eager) and "this backend failed" in out.stats["compile_fallback"]
        assert len(warned) == 1 and config.suppress_errors is True
    finally:
        config.suppress_errors = before


@pytest.mark.parametrize("window", [2, 3, 5])
def test_rpt_iters_is_bounded_by_the_window(window):
    """``rpt_iters * rpt_window <= 256`` (proposals per new token): the bound itself passes, one more is one
    line naming the bound at that window; a typo like 2e9 (a float) or 2 * 10**9 never allocates."""
    high = MAX_PROPOSALS_PER_TOKEN // window
    assert SamplingConfig(rpt_iters=high, rpt_window=window).rpt_iters == high
    for bad in (high + 1, 2 * 10**9):
        with pytest.raises(ValueError, match=rf"rpt_iters={bad} is invalid: with rpt_window={window} use an integer "
                                             rf"in \[0, {high}\]") as error:
            SamplingConfig(rpt_iters=bad, rpt_window=window)
        assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="rpt_iters=2000000000.0 is invalid: use an integer"):
        SamplingConfig(rpt_iters=2e9)
    with pytest.raises(ValueError, match=r"rpt_window=1000000000 is invalid: use an integer in \[2, 256\]"):
        SamplingConfig(rpt_iters=1, rpt_window=10**9)
