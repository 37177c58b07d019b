"""The persistent-batch LZ state (rpt/integrations/lz_rows.py) against the HF processor run from
scratch on each request's whole context, through random adds, removals, moves and swaps."""

import random

import pytest
import torch

from rpt.integrations.lz_rows import LZRows
from rpt.integrations.lz_settings import LZSettings
from rpt.sampling.lz.processor import LZPenaltyLogitsProcessor

V = 40


def expected(logits_row, settings, prompt, output):
    """Truth: the processor sample.py uses, from scratch on [prompt + output]."""
    if settings is None:
        return logits_row
    ids = torch.tensor([prompt + output])
    proc = LZPenaltyLogitsProcessor(settings.alpha, settings.window, settings.buffer,
                                    prompt_length=0 if settings.include_prompt else len(prompt), variant=settings.variant)
    return proc(ids, logits_row[None].clone())[0]


SETTINGS = [
    None,
    LZSettings(0.5, 6, 3, "codelength", False),
    LZSettings(0.5, 6, 3, "codelength", True),
    LZSettings(1.0, 9, 2, "closest_longest", False),
    LZSettings(0.3, 9, 2, "closest_longest", True),
]


@pytest.mark.parametrize("seed, max_rows, choices", [(0, 5, SETTINGS), (1, 5, SETTINGS), (2, 5, SETTINGS),
                                                      (3, 5, SETTINGS), (4, 24, SETTINGS[:2]), (5, 24, SETTINGS[2:4])])
def test_random_batch_changes_match_the_processor_from_scratch(seed, max_rows, choices):
    """24 rows over one or two settings: groups grow past 8 slots and are compacted as rows leave."""
    rng = random.Random(seed)
    state = LZRows(max_rows, "cpu")
    batch: dict[int, tuple] = {}  # row -> (settings, prompt, output)
    for step in range(60):
        # the engine's changes: removed, then added (often over a finished row), then moved
        for row in list(batch):
            if rng.random() < 0.1:
                del batch[row]
                if rng.random() < 0.5:  # a finished row is often not listed as removed
                    state.remove(row)
        for row in range(max_rows):
            if row not in batch and rng.random() < 0.5 or row in batch and rng.random() < 0.05:
                req = (rng.choice(choices), [rng.randrange(4) for _ in range(rng.randrange(0, 12))], [])
                if rng.random() < 0.2:  # a resumed request arrives with tokens already generated
                    req[2].extend(rng.randrange(4) for _ in range(rng.randrange(1, 15)))
                batch[row] = req
                state.add(row, req[0], req[1], req[2])
        if rng.random() < 0.3 * (max_rows <= 5) or rng.random() < 0.15:  # large batches also empty out
            for row in [r for r in batch if rng.random() < 0.7]:
                del batch[row]
                state.remove(row)
        if rng.random() < 0.3:
            a, b = rng.sample(range(max_rows), 2)
            if rng.random() < 0.5:
                batch[a], batch[b] = batch.get(b), batch.get(a)
                batch = {k: v for k, v in batch.items() if v is not None}
                state.swap(a, b)
            elif a in batch:
                batch[b] = batch.pop(a)
                state.move(a, b)
        logits = torch.randn(max_rows, V, generator=torch.Generator().manual_seed(step))
        want = logits.clone()
        for row, (settings, prompt, output) in batch.items():
            want[row] = expected(logits[row], settings, prompt, output)
        got = state.apply(logits.clone())
        for row in range(max_rows):
            if row not in batch:
                continue  # an empty row's logits are never read: they need not be kept
            torch.testing.assert_close(got[row], want[row], rtol=0, atol=1e-6, msg=f"step {step} row {row}")
        for _, _, output in batch.values():  # the engine appends the sampled token (few ids: long matches)
            output.append(rng.randrange(4))


def test_rows_without_lz_are_untouched_bit_for_bit():
    state = LZRows(3, "cpu")
    state.add(0, SETTINGS[1], [1, 2], [1, 2, 1, 2, 1])
    state.add(2, None, [1, 2], [1, 2, 1, 2, 1])
    logits = torch.randn(3, V)
    got = state.apply(logits.clone())
    assert torch.equal(got[1:], logits[1:]) and not torch.equal(got[0], logits[0])


def test_placeholders_wait_until_filled_and_taken_back_tokens_restart_the_row():
    settings = SETTINGS[1]
    state = LZRows(1, "cpu")
    out = [1, 2, 1]
    state.add(0, settings, [3], out)
    out.append(-1)  # an asynchronous engine's placeholder: not yet a token
    logits = torch.randn(1, V)
    torch.testing.assert_close(state.apply(logits.clone())[0], expected(logits[0], settings, [3], [1, 2, 1]))
    out[-1] = 2
    torch.testing.assert_close(state.apply(logits.clone())[0], expected(logits[0], settings, [3], [1, 2, 1, 2]))
    del out[1:]  # the engine discarded tokens
    out.append(3)
    torch.testing.assert_close(state.apply(logits.clone())[0], expected(logits[0], settings, [3], [1, 3]))


@pytest.mark.parametrize("extra, message", [
    ({"lz_penalty": -1}, "lz_penalty=-1.0 is invalid: use alpha >= 0"),
    ({"lz_penalty": 0.15, "lz_window": 0}, "lz_window=0 is invalid: use an integer >= 1"),
    ({"lz_penalty": 0.15, "lz_variant": "dry"}, "lz_variant='dry' is invalid"),
    ({"lz_penalty": 0.15, "lz_windw": 64}, r"\['lz_windw'\] are not LZ penalty settings: use lz_penalty, lz_window"),
    ({"lz_window": 64}, "without 'lz_penalty': add lz_penalty"),
    ({"rpt_iters": 1, "lz_penalty": 0.15}, "lz_penalty together with rpt_iters is not served yet"),
])
def test_bad_settings_are_one_clear_error(extra, message):
    with pytest.raises(ValueError, match=message):
        LZSettings.from_extra_args(extra)


def test_settings_default_as_sampling_config_and_absent_or_zero_is_off():
    assert LZSettings.from_extra_args(None) is None
    assert LZSettings.from_extra_args({"other_plugin": 1}) is None
    assert LZSettings.from_extra_args({"lz_penalty": 0}) is None
    assert LZSettings.from_extra_args({"lz_penalty": 0.15}) == LZSettings(0.15, 512, 32, "codelength", False)


def test_include_prompt_as_the_http_api_delivers_it():
    """vllm_xargs values are str | int | float: a JSON true reaches the processor as 1."""
    for value in (1, "true", True):
        assert LZSettings.from_extra_args({"lz_penalty": 0.1, "lz_include_prompt": value}).include_prompt is True
    assert LZSettings.from_extra_args({"lz_penalty": 0.1, "lz_include_prompt": 0}).include_prompt is False
    with pytest.raises(ValueError, match="lz_include_prompt=2 is invalid: use True or False"):
        LZSettings.from_extra_args({"lz_penalty": 0.1, "lz_include_prompt": 2})


def test_state_is_bounded_by_the_live_rows_not_the_traffic():
    """Before: one [max_rows, W] group per distinct lz_penalty ever seen, kept forever, each looped over
    every step (3000 requests: 3000 groups, 51 MB at 8 rows, W 64); here 300 distinct settings."""
    import rpt.integrations.lz_rows as lz_rows

    state = LZRows(8, "cpu")
    rng = random.Random(0)
    live: dict[int, list[int]] = {}
    peak = 0
    for request in range(300):
        row = request % 8
        settings = LZSettings(0.01 + request * 1e-4, 64, 8, "codelength", request % 2 == 0)  # all distinct
        state.add(row, settings, [rng.randrange(5) for _ in range(5)], live.setdefault(row, []))
        live[row] = state.rows[row].output
        state.apply(torch.randn(8, V))
        live[row].append(rng.randrange(5))
        peak = max(peak, state.state_bytes())
        if request % 3 == 0:  # some finish and leave their row empty
            state.remove(row)
    assert len(state.groups) == len({r.settings for r in state.rows.values()}) <= 8
    one_row = 2 * 64 * 8 + 4 * 9 * 64 + 4 * 64  # a row's window and match lengths, its setting's table
    assert peak <= 8 * one_row
    calls = []
    real = lz_rows.apply_codelength
    lz_rows.apply_codelength = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        for row in list(state.rows)[1:]:
            state.remove(row)
        state.apply(torch.randn(8, V))
    finally:
        lz_rows.apply_codelength = real
    assert len(calls) == 1  # a step's work follows the live rows, not the settings ever seen


def test_windows_and_buffers_above_the_engine_bound_are_refused_at_admission():
    from rpt.integrations.lz_settings import MAX_BUFFER, MAX_WINDOW

    assert LZSettings.from_extra_args({"lz_penalty": 0.1, "lz_window": MAX_WINDOW, "lz_buffer": MAX_BUFFER})
    for extra, key in (({"lz_window": MAX_WINDOW + 1}, "lz_window"), ({"lz_window": 10**12}, "lz_window"),
                       ({"lz_buffer": MAX_BUFFER + 1}, "lz_buffer")):
        with pytest.raises(ValueError, match=f"{key}=.* is (above the engine's bound|invalid)"):
            LZSettings.from_extra_args({"lz_penalty": 0.1, **extra})
