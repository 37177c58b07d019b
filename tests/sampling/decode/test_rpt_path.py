"""The batch-flat greedy RPT step (``rpt/sampling/decode/rpt_path.py``) against the uncached reference and the
per-row driver it hands events to: the same tokens, finish reasons, corrections and model calls over
random greedy configurations (k, w, confidence from "never" to "always" correcting, penalties, LZ,
EOS, ragged rows, budgets), a batched row equal to the row alone, and per-row Python only at events."""

import random

import pytest
import torch

from rpt.sampling import SamplingConfig, generate, generate_reference
from rpt.sampling.decode import rpt_path
from rpt.sampling.decode.driver import Decoder
from tests.sampling.decode.test_decoder import prompts, rpt_model


@pytest.fixture(scope="module")
def models():
    return {w: rpt_model(w) for w in (2, 3)}


def flat_and_per_row_sends(monkeypatch, model, ids, cfg, mask):
    """The flat-step decode and its program resumptions (``Decoder._send``), and the per-row driver's
    resumptions alone; asserts both decode the same tokens."""
    sends = []
    monkeypatch.setattr(Decoder, "_send", lambda self, s, a, send=Decoder._send: sends.append(1) or send(self, s, a))
    flat = generate(model, ids, cfg, attention_mask=mask)
    flat_sends, sends[:] = len(sends), []
    rows = per_row_driver(monkeypatch, model, ids, cfg, mask)
    assert torch.equal(flat.sequences, rows.sequences)
    return flat, flat_sends, len(sends)


def per_row_driver(monkeypatch, model, ids, cfg, mask):
    """``generate`` with the batch-flat step switched off."""
    with monkeypatch.context() as m:
        m.setattr(rpt_path, "eligible", lambda inputs, streamer: False)
        return generate(model, ids, cfg, attention_mask=mask)


def random_rpt_config(rng: random.Random, window: int, eos: int) -> SamplingConfig:
    return SamplingConfig(
        max_new_tokens=rng.choice([1, 6, 14]), rpt_iters=rng.choice([1, 2, 3]), rpt_window=window,
        confidence=rng.choice([0.0, 0.3, 0.6, 0.9, 1.0]), repetition_penalty=rng.choice([1.0, 1.3]),
        frequency_penalty=rng.choice([0.0, 0.5]), lz_penalty=rng.choice([0.0, 0.5]), lz_window=16,
        penalize_ptp=rng.random() < 0.5, eos_token_id=rng.choice([[], eos]))


@pytest.mark.parametrize("case", range(16))
def test_flat_step_equals_reference_and_per_row_driver(models, monkeypatch, case):
    rng = random.Random(case)
    window, batch = rng.choice([2, 3]), rng.choice([1, 3])
    ids, mask = prompts(batch, lengths=rng.choice([(9, 5, 7), (4, 10, 7), (6, 6, 6)]), seed=case)
    if batch == 1 or rng.random() < 0.3:
        ids, mask = ids[:, -4:], None
    free = generate(models[window], ids, SamplingConfig(max_new_tokens=12, eos_token_id=[]), attention_mask=mask)
    cfg = random_rpt_config(rng, window, eos=free.generated(0)[rng.randrange(6)])
    runs = []
    monkeypatch.setattr(rpt_path.RPTPath, "run", lambda path, n, run=rpt_path.RPTPath.run: runs.append(n) or run(path, n))
    fast = generate(models[window], ids, cfg, attention_mask=mask)
    assert runs or cfg.max_new_tokens == 1  # the flat step ran (a 1-token decode has no step after the prefill)
    ref = generate_reference(models[window], ids, cfg, attention_mask=mask)
    rows = per_row_driver(monkeypatch, models[window], ids, cfg, mask)
    assert torch.equal(fast.sequences, ref.sequences) and torch.equal(fast.sequences, rows.sequences)
    assert fast.finish_reasons == ref.finish_reasons == rows.finish_reasons
    assert fast.stats["corrections"] == ref.stats["corrections"] == rows.stats["corrections"]
    assert fast.stats["forward_passes"] == rows.stats["forward_passes"]  # an event costs no extra call


def test_corrections_and_stops_in_the_middle_hand_over_and_back(models, monkeypatch):
    """Confidence 0.6 on this model corrects some positions and not others: the flat step hands rows
    over at a correction and takes them back; the rows also stop at an EOS and a short budget."""
    ids, mask = prompts(3, lengths=(4, 10, 7), seed=1)
    cfg = SamplingConfig(max_new_tokens=24, rpt_iters=2, rpt_window=3, confidence=0.6, eos_token_id=[])
    runs = []
    monkeypatch.setattr(rpt_path.RPTPath, "run", lambda path, n, run=rpt_path.RPTPath.run: runs.append(n) or run(path, n))
    fast = generate(models[3], ids, cfg, attention_mask=mask)
    ref = generate_reference(models[3], ids, cfg, attention_mask=mask)
    assert torch.equal(fast.sequences, ref.sequences)
    assert fast.stats["corrections"] == ref.stats["corrections"] > 0
    assert len(runs) > 1  # taken back after a hand-over
    eos = fast.generated(1)[15]
    stop = SamplingConfig(max_new_tokens=24, rpt_iters=2, rpt_window=3, confidence=0.6, eos_token_id=eos)
    fast, ref = (f(models[3], ids, stop, attention_mask=mask) for f in (generate, generate_reference))
    assert torch.equal(fast.sequences, ref.sequences) and fast.finish_reasons == ref.finish_reasons
    assert "eos" in fast.finish_reasons


@pytest.mark.parametrize("window", [2, 3])
def test_batched_rows_equal_their_single_runs(models, window):
    ids, mask = prompts(3, lengths=(4, 10, 7), seed=2)
    cfg = SamplingConfig(max_new_tokens=16, rpt_iters=1, rpt_window=window, confidence=0.6)
    batched = generate(models[window], ids, cfg, attention_mask=mask)
    for b in range(3):
        single = generate(models[window], ids[b: b + 1, mask[b].argmax():], cfg)
        assert batched.generated(b) == single.generated(0)


def test_per_row_python_only_at_events(models, monkeypatch):
    """No correction (confidence 1: nothing is accepted) and no stop until the budget: the rows'
    programs are resumed a bounded number of times, not once per row per step as without the flat step."""
    ids, mask = prompts(3, seed=3)
    cfg = SamplingConfig(max_new_tokens=30, rpt_iters=1, rpt_window=3, confidence=1.0, eos_token_id=[])
    flat, flat_sends, row_sends = flat_and_per_row_sends(monkeypatch, models[3], ids, cfg, mask)
    assert flat_sends <= 3 * 3  # the last position of each row, handed back to finish it
    assert row_sends >= 3 * 29


def test_nan_logits_in_a_flat_step_raise_naming_the_row(models):
    """Logits that turn NaN mid-decode (after the per-row prefill) raise in the flat step, naming the row."""
    ids, mask = prompts(3, seed=4)
    cfg = SamplingConfig(max_new_tokens=12, rpt_iters=1, rpt_window=2, confidence=0.9, eos_token_id=[])
    calls = []

    def poison(module, args, out):
        calls.append(1)
        if len(calls) == 5:  # the prefill, then flat steps
            out = out.clone()
            out[1, :, 3] = float("nan")
        return out

    hook = models[2].lm.lm_head.register_forward_hook(poison)
    try:
        with pytest.raises(ValueError, match=r"NaN or inf \(rows \[1\]\)"):
            generate(models[2], ids, cfg, attention_mask=mask)
    finally:
        hook.remove()
    assert len(calls) == 5


SAMPLED_CASES = [  # (k, batch, temperature, window): k = 2 is not flat (a redraw feeds the next sweep)
    (1, 1, 0.5, 2), (1, 3, 1.0, 3), (1, 8, 2.0, 2), (1, 8, 1.0, 3), (1, 3, 2.0, 2), (1, 1, 1.0, 3),
    (2, 3, 1.0, 2), (2, 8, 0.5, 3),
]


@pytest.mark.parametrize("case", range(len(SAMPLED_CASES)))
def test_sampled_flat_step_equals_reference_and_per_row_driver(models, monkeypatch, case):
    """Sampled RPT (temperature > 0): the flat step (k = 1) gives the reference's tokens, corrections
    and finish reasons, and the per-row driver's calls, over seeds, temperatures, confidences that
    correct often or never, sampled or greedy PTP, penalties (LZ included, on PTP too or not), top-k /
    top-p, an EOS met mid-way, ragged rows."""
    k, batch, temperature, window = SAMPLED_CASES[case]
    rng = random.Random(100 + case)
    lengths = tuple(rng.randrange(3, 11) for _ in range(batch))
    ids, mask = prompts(batch, lengths=lengths, seed=case)
    cfg = SamplingConfig(
        max_new_tokens=rng.choice([6, 14]) if k == 1 else 6, rpt_iters=k, rpt_window=window, temperature=temperature,
        seed=case,
        confidence=rng.choice([0.0, 0.05, 0.3, 0.9]), top_k=rng.choice([0, 8]), top_p=rng.choice([1.0, 0.9]),
        ptp_greedy=case % 2 == 1, repetition_penalty=rng.choice([1.0, 1.3]), frequency_penalty=rng.choice([0.0, 0.5]),
        lz_penalty=rng.choice([0.0, 0.5]), lz_window=16, penalize_ptp=rng.random() < 0.5, eos_token_id=[])
    if case % 3 != 2:  # an EOS the sampled decode meets: a token it settles on mid-way
        cfg.eos_token_id = generate(models[window], ids, cfg, attention_mask=mask).generated(0)[rng.randrange(1, 5)]
    runs = []
    monkeypatch.setattr(rpt_path.RPTPath, "run", lambda path, n, run=rpt_path.RPTPath.run: runs.append(n) or run(path, n))
    fast = generate(models[window], ids, cfg, attention_mask=mask)
    assert bool(runs) == (k == 1)  # sampled k = 1 takes the flat step; k = 2 stays per row
    ref = generate_reference(models[window], ids, cfg, attention_mask=mask)
    rows = per_row_driver(monkeypatch, models[window], ids, cfg, mask)
    assert torch.equal(fast.sequences, ref.sequences) and torch.equal(fast.sequences, rows.sequences)
    assert fast.finish_reasons == ref.finish_reasons == rows.finish_reasons
    assert fast.stats["corrections"] == ref.stats["corrections"] == rows.stats["corrections"]
    assert fast.stats["forward_passes"] == rows.stats["forward_passes"]


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_sampled_per_row_python_only_at_events(models, monkeypatch, temperature):
    """Sampled k = 1, confidence 1 (nothing is accepted, but x_t is redrawn after every sweep): the
    rows' programs are resumed a bounded number of times, and the tokens are the per-row driver's;
    a batched row equals that row alone with its seed."""
    ids, mask = prompts(3, seed=4)
    cfg = SamplingConfig(max_new_tokens=30, rpt_iters=1, rpt_window=3, confidence=1.0, temperature=temperature,
                         top_p=0.95, seed=7, eos_token_id=[])
    flat, flat_sends, row_sends = flat_and_per_row_sends(monkeypatch, models[3], ids, cfg, mask)
    assert flat_sends <= 3 * 3 and row_sends >= 3 * 29
    assert len({tuple(flat.generated(b)) for b in range(3)}) == 3
    for b in range(3):
        single = generate(models[3], ids[b: b + 1, mask[b].argmax():], cfg, row_seeds=[flat.row_seeds[b]])
        assert single.generated(0) == flat.generated(b)
