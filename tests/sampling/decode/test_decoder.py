"""The fast RPT decoder (``rpt.sampling.decode.generate.generate``) against the cache-free oracle and HF.

Both decoders drive one statement of the algorithm (:mod:`rpt.sampling.algorithm`) and key every
random draw by position, so under sampling too they must emit the same tokens; the statement itself
is checked against an exact enumeration of eq. 4 in ``test_eq4_distribution.py``.

Models are tiny random Llamas in float64 (so the cached and the recomputed paths cannot differ by a
rounding tie) with weights at a larger scale than the default init (``initializer_range=0.4``) so
greedy decoding does not collapse onto one token, and a random offset table so PTP differs from NTP.
"""

import math
import random

import pytest
import torch

from rpt.model import RPTForCausalLM
from rpt.sampling.config import SamplingConfig
from rpt.sampling.decode.generate import generate
from rpt.sampling.proposals import Proposer
from rpt.sampling.randomness import NTP, row_seed, uniforms
from rpt.sampling.reference import generate_reference
from tests.helpers.tiny_models import tiny_gpt2, tiny_llama

V = 97


def rpt_model(window: int, seed: int = 0, attn: str = "sdpa", zero_ntp_row: bool = False) -> RPTForCausalLM:
    model = RPTForCausalLM.from_base(tiny_llama(seed=seed, attn=attn, initializer_range=0.4), window=window)
    model = model.double().eval()
    g = torch.Generator().manual_seed(100 + seed)
    with torch.no_grad():
        table = 0.3 * torch.randn(model.offset_embedding.weight.shape, generator=g, dtype=torch.float64)
        model.offset_embedding.weight.copy_(table)
        if zero_ntp_row:  # row 0 is added to every NTP token: zero it to compare with the bare HF model
            model.offset_embedding.weight[0].zero_()
    # a random model has no real EOS (LlamaConfig's default id 2 is just a token): the tests that
    # stop at EOS name it; the others run to max_new_tokens
    model.lm.generation_config.eos_token_id = None
    return model


@pytest.fixture(scope="module")
def models():
    return {w: rpt_model(w) for w in (2, 3)}


def prompts(batch: int, lengths=(9, 5, 7), seed: int = 0):
    """Left-padded prompts of different lengths (the first ``batch`` of ``lengths``)."""
    lengths = lengths[:batch]
    width = max(lengths)
    ids = torch.randint(0, V, (batch, width), generator=torch.Generator().manual_seed(seed))
    mask = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        mask[b, width - n:] = 1
        ids[b, : width - n] = 0
    return ids, mask


def repeats(generated: list[int]) -> int:
    return sum(1 for i, tok in enumerate(generated) if tok in generated[:i])


@pytest.mark.parametrize("window", [2, 3])
@pytest.mark.parametrize("batch", [1, 3])
def test_generate_equals_reference_and_corrects(models, window, batch):
    ids, mask = prompts(batch)
    cfg = SamplingConfig(max_new_tokens=14, rpt_iters=2, rpt_window=window, confidence=0.0)
    fast = generate(models[window], ids, cfg, attention_mask=mask)
    ref = generate_reference(models[window], ids, cfg, attention_mask=mask)
    assert torch.equal(fast.sequences, ref.sequences)
    assert fast.stats["corrections"] == ref.stats["corrections"] > 0
    assert fast.finish_reasons == ref.finish_reasons == ["length"] * batch
    # RPT changed the text: plain NTP on the same model gives something else
    ntp = generate(models[window], ids, SamplingConfig(max_new_tokens=14), attention_mask=mask)
    assert not torch.equal(ntp.sequences, fast.sequences)
    # the cache pays off even when every position is corrected
    assert fast.stats["forward_passes"] < ref.stats["forward_passes"]


@pytest.mark.parametrize("window", [2, 3])
def test_batched_rows_equal_their_single_runs(models, window):
    ids, mask = prompts(3, lengths=(4, 10, 7), seed=1)
    cfg = SamplingConfig(max_new_tokens=12, rpt_iters=2, rpt_window=window, confidence=0.0)
    batched = generate(models[window], ids, cfg, attention_mask=mask)
    assert batched.stats["corrections"] > 0
    for b in range(3):
        row = ids[b : b + 1, mask[b].argmax():]
        single = generate(models[window], row, cfg)
        assert single.generated(0) == batched.generated(b)
        assert torch.equal(single.sequences[0, : row.shape[1]], row[0])


def test_rpt_iters_zero_is_hf_greedy():
    model = rpt_model(2, zero_ntp_row=True)
    ids, mask = prompts(3, seed=2)
    eos = model.config.eos_token_id  # 2: one row of this run ends on it
    hf = model.lm.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=eos,
                           eos_token_id=eos)
    cfg = SamplingConfig(max_new_tokens=12, rpt_iters=0, eos_token_id=eos)
    ours = generate(model, ids, cfg, attention_mask=mask)
    assert torch.equal(hf, ours.sequences)
    assert "eos" in ours.finish_reasons and "length" in ours.finish_reasons
    assert ours.stats["corrections"] == 0 and ours.stats["forward_passes"] == 12  # prefill + 11 steps
    # a plain HF model (no offset table) is fine for NTP sampling too
    plain = generate(model.lm, ids, cfg, attention_mask=mask)
    assert torch.equal(hf, plain.sequences)


@pytest.mark.parametrize("window,include_prompt", [(2, False), (3, True)])
def test_processors_applied_identically(models, window, include_prompt):
    ids, mask = prompts(3, seed=3)
    kw = dict(max_new_tokens=14, rpt_iters=2, rpt_window=window, confidence=0.0)
    # with the prompt in the LZ window, a strong penalty bans every token the row has seen
    penalties = dict(lz_penalty=30.0 if include_prompt else 0.8, lz_window=16, lz_include_prompt=include_prompt,
                     repetition_penalty=3.0, frequency_penalty=0.4, presence_penalty=0.2)
    cfg = SamplingConfig(**kw, **penalties)
    ref = generate_reference(models[window], ids, cfg, attention_mask=mask)
    # fill the left padding with tokens the rows go on to choose: padding is not context, so a
    # decoder whose penalties saw it would ban them and differ
    for b in range(3):
        pad = int((mask[b] == 0).sum())
        ids[b, :pad] = torch.tensor(ref.generated(b)[:pad])
    # the decoder writes its pad id into padding columns; make that a token row 1 chooses first
    model, old_pad = models[window], models[window].config.pad_token_id
    model.config.pad_token_id = ref.generated(1)[0]
    try:
        fast = generate(model, ids, cfg, attention_mask=mask)
    finally:
        model.config.pad_token_id = old_pad
    assert torch.equal(fast.sequences[:, ids.shape[1]:], ref.sequences[:, ids.shape[1]:])
    assert torch.equal(fast.sequences, generate_reference(models[window], ids, cfg, attention_mask=mask).sequences)
    assert fast.stats["corrections"] == ref.stats["corrections"] > 0
    unpenalised = generate(models[window], ids, SamplingConfig(**kw), attention_mask=mask)
    assert not torch.equal(unpenalised.sequences, fast.sequences)  # the penalties did act


@pytest.mark.parametrize("window", [2, 3])
def test_penalize_ptp_keeps_lz_bans(models, window):
    """A huge LZ penalty bans every token already generated; with ``penalize_ptp`` corrections obey it."""
    ids, _ = prompts(1, seed=4)
    base = dict(max_new_tokens=20, rpt_iters=2, rpt_window=window, confidence=0.0, lz_penalty=30.0, lz_window=64)
    runs = {}
    for flag in (True, False):
        cfg = SamplingConfig(**base, penalize_ptp=flag)
        runs[flag] = generate(models[window], ids, cfg)
        ref = generate_reference(models[window], ids, cfg)
        assert torch.equal(runs[flag].sequences, ref.sequences)
        assert runs[flag].stats["corrections"] > 0
    assert repeats(runs[True].generated(0)) == 0
    assert repeats(runs[False].generated(0)) > 0


def test_proposer_rules():
    """PTP: argmax of the penalised logits; confidence read at temperature 1, before truncation."""
    logits = torch.tensor([[3.0, 2.0, 0.0, -1.0]])
    context = torch.tensor([[0]])  # token 0 was seen: the repetition penalty hits it
    cfg = dict(temperature=0.5, top_k=1, repetition_penalty=4.0)
    seeds = torch.tensor([0])

    def ptp(config, z=logits):
        return Proposer(config, 0, seeds).ptp(context, z.clone(), 1, 1, 1)

    tok, acc = ptp(SamplingConfig(**cfg, confidence=0.5))
    post = torch.softmax(torch.tensor([0.75, 2.0, 0.0, -1.0]), -1)  # 3.0 / 4 after the penalty
    assert tok.item() == 1 and acc.item() == bool(post[1] > 0.5)
    # the same threshold just below / above that probability flips the decision
    for eta, expect in ((post[1].item() - 1e-3, True), (post[1].item() + 1e-3, False)):
        assert ptp(SamplingConfig(**cfg, confidence=eta))[1].item() is expect
    # "exceeds": a probability equal to the threshold is not enough (softmax of a tie is exactly 0.5)
    tie = torch.zeros(1, 2)
    assert not ptp(SamplingConfig(confidence=0.5), tie)[1].item()
    assert ptp(SamplingConfig(confidence=0.4999), tie)[1].item()
    # without penalize_ptp the proposal ignores the penalty
    assert ptp(SamplingConfig(**cfg, penalize_ptp=False))[0].item() == 0
    # NTP always gets the penalties (greedy here)
    assert Proposer(SamplingConfig(repetition_penalty=4.0), 0, seeds).ntp(context, logits.clone(), 1).item() == 1


def test_draws_are_keyed_by_position_not_by_order():
    """A sampled proposal is a function of (row seed, position, iteration, kind) and the logits only."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 50, generator=g)
    cfg = SamplingConfig(temperature=1.0, rpt_iters=2)
    seeds = torch.tensor([5, 6, 7])
    p = Proposer(cfg, 0, seeds)
    a = p.ntp(torch.zeros(3, 1, dtype=torch.long), logits.clone(), torch.tensor([4, 9, 9]))
    assert a.shape == (3, 3)  # one draw per RPT iteration 0..k
    again = Proposer(cfg, 0, seeds).ntp(torch.zeros(3, 1, dtype=torch.long), logits.clone(), torch.tensor([4, 9, 9]))
    assert torch.equal(a, again)
    alone = Proposer(cfg, 0, seeds[1:2]).ntp(torch.zeros(1, 1, dtype=torch.long), logits[1:2].clone(), 9)
    assert torch.equal(alone[0], a[1])  # row 1 alone: the same draws
    keys = [uniforms(seeds, 4, 0, NTP), uniforms(seeds, 5, 0, NTP), uniforms(seeds, 4, 1, NTP), uniforms(seeds, 4, 0, 1)]
    assert len({float(u[0, 0]) for u in keys}) == 4  # position, iteration and kind each change the draw
    assert torch.equal(uniforms(seeds, 4, 0, NTP, draws=2)[:, 1], uniforms(seeds, 4, 1, NTP)[:, 0])
    # the empirical law of many keyed draws is the softmax (inverse CDF at uniform keys)
    many = Proposer(cfg, 0, torch.arange(4000)).ntp(torch.zeros(4000, 1, dtype=torch.long),
                                                     logits[:1].expand(4000, -1).clone(), 3)[:, 0]
    freq = torch.bincount(many, minlength=50).double() / 4000
    assert 0.5 * (freq - torch.softmax(logits[0].double(), -1)).abs().sum() < 0.06


@pytest.mark.parametrize("window", [2, 3])
def test_early_stop_and_one_call_per_token(models, window):
    """confidence=1 never accepts (p > 1 is impossible): one sweep per position, one call per token.

    Each call feeds x_t and carries both the NTP query for x_{t+1} and the PTP queries of x_t's window.
    """
    ids, _ = prompts(1, seed=5)
    n = 10
    calls = {}
    for iters in (1, 4):
        cfg = SamplingConfig(max_new_tokens=n, rpt_iters=iters, rpt_window=window, confidence=1.0)
        ref = generate_reference(models[window], ids, cfg)
        fast = generate(models[window], ids, cfg)
        assert torch.equal(ref.sequences, fast.sequences) and fast.stats["corrections"] == 0
        assert fast.stats["forward_passes"] == n + 1  # the last token's window needs it fed once more
        calls[iters] = ref.stats["forward_passes"]
    # the reference: one NTP call per position plus one PTP call per revisited token, once
    revisits = sum(min(t, window - 1) for t in range(n))
    assert calls[1] == calls[4] == n + revisits
    # stochastic proposals do not stop early: every iteration sweeps, then x_t is drawn again (eq. 4)
    sampled = dict(max_new_tokens=n, rpt_window=window, confidence=1.0, ptp_greedy=False, temperature=1.0, seed=0)
    windows = n - 1  # positions with a window to revisit (all but the first)
    for iters in (1, 4):
        ref = generate_reference(models[window], ids, SamplingConfig(rpt_iters=iters, **sampled))
        assert ref.stats["forward_passes"] == n + iters * (revisits + windows)
        fast = generate(models[window], ids, SamplingConfig(rpt_iters=iters, **sampled))
        assert torch.equal(ref.sequences, fast.sequences)
        # the call of sweep i already feeds the redraw of x_t that follows it: one call per sweep
        assert fast.stats["forward_passes"] == 1 + 1 + iters * windows


def test_stats_and_rows_finish_independently(models):
    ids, mask = prompts(3, seed=6)
    cfg = dict(max_new_tokens=12, rpt_iters=1, rpt_window=2, confidence=0.0)
    free = generate(models[2], ids, SamplingConfig(**cfg), attention_mask=mask)
    # an EOS id that row 0 produces mid-way and the other rows never produce
    row0 = free.generated(0)
    others = set(free.generated(1)) | set(free.generated(2))
    cut = next(i for i, tok in enumerate(row0) if 2 <= i < 10 and tok not in others and tok not in row0[:i])
    eos = row0[cut]
    for decode in (generate, generate_reference):
        out = decode(models[2], ids, SamplingConfig(**cfg, eos_token_id=eos), attention_mask=mask)
        assert out.generated(0) == row0[: cut + 1]
        assert out.finish_reasons == ["eos", "length", "length"]
        assert out.generated(1) == free.generated(1) and out.generated(2) == free.generated(2)
        width = out.prompt_width
        assert (out.sequences[0, width + cut + 1:] == eos).all()  # padded with the pad id (= eos here)
        s = out.stats
        assert s["new_tokens"] == cut + 1 + 24 == sum(out.new_token_counts)
        assert s["tokens_per_s"] > 0 and s["corrections"] >= 0
        assert s["calls_per_token"] == pytest.approx(s["forward_passes"] / s["new_tokens"])
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        generate(models[2], ids, SamplingConfig(stop=["x"]))


@pytest.mark.parametrize("decode", [generate, generate_reference])
def test_seeded_sampling_is_reproducible(models, decode):
    ids, mask = prompts(3, seed=7)
    kw = dict(max_new_tokens=12, temperature=1.0, top_p=0.95, rpt_iters=2, rpt_window=3, confidence=0.05,
              ptp_greedy=False)
    a = decode(models[3], ids, SamplingConfig(**kw, seed=1), attention_mask=mask)
    b = decode(models[3], ids, SamplingConfig(**kw, seed=1), attention_mask=mask)
    c = decode(models[3], ids, SamplingConfig(**kw, seed=2), attention_mask=mask)
    assert torch.equal(a.sequences, b.sequences) and a.stats["corrections"] == b.stats["corrections"]
    assert not torch.equal(a.sequences, c.sequences)
    assert a.stats["corrections"] > 0


@pytest.mark.parametrize("arch", ["llama-eager", "gpt2"])
def test_other_attention_paths_match_reference(arch):
    """The additive 4D mask also drives eager attention and learned absolute positions (GPT-2)."""
    if arch == "gpt2":  # its EOS (50256) lies outside this vocabulary: never generated, never a pad id
        model = RPTForCausalLM.from_base(tiny_gpt2(), window=3).double().eval()
        with torch.no_grad():
            model.offset_embedding.weight.copy_(
                0.5 * torch.randn(model.offset_embedding.weight.shape, generator=torch.Generator().manual_seed(0)))
    else:
        model = rpt_model(3, attn="eager")
    ids, mask = prompts(3, seed=8)
    cfg = SamplingConfig(max_new_tokens=10, rpt_iters=2, rpt_window=3, confidence=0.0)
    fast = generate(model, ids, cfg, attention_mask=mask)
    ref = generate_reference(model, ids, cfg, attention_mask=mask)
    assert torch.equal(fast.sequences, ref.sequences) and fast.stats["corrections"] > 0


def test_bad_inputs(models):
    ids, mask = prompts(3)
    with pytest.raises(ValueError, match="needs an RPTForCausalLM"):
        generate(models[2].lm, ids, SamplingConfig(rpt_iters=1))
    with pytest.raises(ValueError, match="larger than the window 2"):
        generate(models[2], ids, SamplingConfig(rpt_iters=1, rpt_window=3))
    with pytest.raises(ValueError, match="left-padded"):
        generate(models[2], ids, SamplingConfig(), attention_mask=mask.flip(1))
    long = torch.zeros(1, 256, dtype=torch.long)
    with pytest.raises(ValueError, match="context is 256"):
        generate_reference(models[2], long, SamplingConfig())
    with pytest.warns(UserWarning, match="past the model's context"):
        out = generate(models[2], long[:, :250], SamplingConfig(max_new_tokens=20))
    assert out.new_token_counts == [6]
    assert math.isfinite(out.stats["tokens_per_s"])


# ---- seeded sampling: the two decoders agree token for token ------------------------------------
def random_config(rng: random.Random) -> dict:
    """A random point of the sampler's knob space (every knob a researcher turns)."""
    cfg = dict(max_new_tokens=10, rpt_window=rng.choice([2, 3]), rpt_iters=rng.choice([1, 2, 3]),
               temperature=rng.choice([0.0, 0.7, 1.0, 1.0, 1.5]), top_k=rng.choice([0, 0, 8]),
               top_p=rng.choice([1.0, 0.9]), min_p=rng.choice([0.0, 0.02]), ptp_greedy=rng.random() < 0.5,
               confidence=rng.choice([0.0, 0.05, 0.3, 0.9]), penalize_ptp=rng.random() < 0.7, seed=rng.randrange(10**6))
    if rng.random() < 0.4:
        cfg["repetition_penalty"] = rng.choice([1.3, 2])  # an int too: it must be accepted
    if rng.random() < 0.4:
        cfg.update(frequency_penalty=0.4, presence_penalty=0.2)
    if rng.random() < 0.4:
        cfg.update(lz_penalty=0.8, lz_window=16, lz_include_prompt=rng.random() < 0.5)
    if rng.random() < 0.3:
        cfg["eos_token_id"] = rng.randrange(V)
    return cfg


def check_case(models, case: int) -> tuple[bool, bool]:
    rng = random.Random(case)
    cfg = SamplingConfig(**random_config(rng))
    ids, mask = prompts(3, lengths=tuple(rng.randint(3, 9) for _ in range(3)), seed=case)
    fast = generate(models[cfg.rpt_window], ids, cfg, attention_mask=mask)
    ref = generate_reference(models[cfg.rpt_window], ids, cfg, attention_mask=mask)
    assert torch.equal(fast.sequences, ref.sequences), (case, cfg)
    assert fast.finish_reasons == ref.finish_reasons and fast.stats["corrections"] == ref.stats["corrections"]
    assert fast.row_seeds == ref.row_seeds == [row_seed(cfg.seed, b) for b in range(3)]
    return fast.stats["corrections"] > 0, "eos" in fast.finish_reasons


# random_config's cases that together draw every value of every knob (each temperature, top-k, top-p, min-p,
# confidence, w and k, greedy and sampled PTP, penalize_ptp on and off, each penalty, LZ with the prompt
# in and out, an EOS id), with two more sampled ones (7: a row stops at its EOS); the other cases of 0-15
# run with the slow test
CASES = (0, 3, 4, 6, 7, 11, 13, 15)


def test_sampled_generate_equals_reference(models):
    """8 random configurations (temperature, top-k/p, min-p, every penalty, penalize_ptp, w, k, EOS,
    ragged batches): the same tokens, reasons and corrections. ``make test-slow`` runs 308 more."""
    results = [check_case(models, case) for case in CASES]
    assert sum(c for c, _ in results) >= len(CASES) // 2 and any(e for _, e in results)


@pytest.mark.slow
def test_sampled_generate_equals_reference_many(models):
    results = [check_case(models, case) for case in range(316) if case not in CASES]
    assert sum(c for c, _ in results) >= 154


@pytest.mark.parametrize("window", [2, 3])
def test_sampled_row_equals_its_single_run_with_its_seed(models, window):
    """Row b of a batch decoded with seed s is the row decoded alone with row seed ``row_seed(s, b)``."""
    ids, mask = prompts(3, lengths=(4, 10, 7), seed=11)
    cfg = SamplingConfig(max_new_tokens=12, rpt_iters=2, rpt_window=window, confidence=0.1, temperature=1.0,
                         top_p=0.95, ptp_greedy=False, lz_penalty=0.5, lz_window=16, seed=40)
    batched = generate(models[window], ids, cfg, attention_mask=mask)
    assert batched.stats["corrections"] > 0
    for b in range(3):
        row = ids[b: b + 1, mask[b].argmax():]
        alone = generate(models[window], row, cfg, row_seeds=[row_seed(40, b)])
        assert alone.generated(0) == batched.generated(b)
        assert generate_reference(models[window], row, cfg, row_seeds=[row_seed(40, b)]).generated(0) == batched.generated(b)
    # n samples of one prompt: rows of a repeated prompt get different seeds, hence different samples
    same = generate(models[window], ids[1:2].expand(4, -1), cfg)
    assert len({tuple(same.generated(b)) for b in range(4)}) > 1
    with pytest.raises(ValueError, match="one per row"):
        generate(models[window], ids, cfg, attention_mask=mask, row_seeds=[1, 2])


def test_stop_strings_eos_and_token_healing_sampled():
    """With a tokenizer: stop strings, EOS and token healing under sampling, both decoders alike."""
    from tests.helpers.tiny_models import tiny_tokenizer

    tok = tiny_tokenizer()
    model = RPTForCausalLM.from_base(tiny_llama(vocab_size=len(tok), seed=3, initializer_range=0.4), window=3)
    model = model.double().eval()
    with torch.no_grad():
        model.offset_embedding.weight.copy_(0.3 * torch.randn(model.offset_embedding.weight.shape,
                                                              generator=torch.Generator().manual_seed(3),
                                                              dtype=torch.float64))
    texts = ["def fib(n", "for i in range(1", "The quick brown ", "class Po"]
    rows = [tok(t)["input_ids"] for t in texts]
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, width - len(r):], mask[b, width - len(r):] = torch.tensor(r), 1
    reasons = set()
    for seed in range(2):  # greedy PTP, then sampled PTP
        kw = dict(max_new_tokens=12, rpt_iters=2, rpt_window=3, confidence=0.2, temperature=0.9,
                  ptp_greedy=seed % 2 == 0, token_healing=True, eos_token_id=tok.eos_token_id, seed=seed)
        free = generate(model, ids, SamplingConfig(**kw), mask, tokenizer=tok)
        # a stop string the rows do produce: two characters from the middle of row 1's text
        text = tok.decode(free.generated(1))
        stop = [text[len(text) // 2: len(text) // 2 + 2] or "x"]
        cfg = SamplingConfig(**kw, stop=stop)
        fast = generate(model, ids, cfg, mask, tokenizer=tok)
        ref = generate_reference(model, ids, cfg, mask, tokenizer=tok)
        assert torch.equal(fast.sequences, ref.sequences) and fast.finish_reasons == ref.finish_reasons
        reasons |= set(fast.finish_reasons)
    assert "stop" in reasons


# ---- attention implementations -------------------------------------------------------------------
def same_weights(attn: str) -> RPTForCausalLM:
    model = rpt_model(3, attn="sdpa")
    model.lm.config._attn_implementation = attn
    return model


@pytest.mark.parametrize("attn", ["eager", "flex_attention", "flash_attention_2", "flash_attention_3"])
def test_attention_implementations_give_sdpas_tokens(attn):
    """eager takes the 4D mask as sdpa does; flex / flash attention (which would misread it) run the
    decoder's masked calls (every call of a padded batch) with sdpa, and the model is left as it was."""
    ids, mask = prompts(3, seed=9)
    cases = [(SamplingConfig(max_new_tokens=10, rpt_iters=2, rpt_window=3, confidence=0.0), ids, mask),
             (SamplingConfig(max_new_tokens=10, rpt_iters=2, rpt_window=3, confidence=0.1, temperature=1.0,
                             ptp_greedy=False, seed=3), ids, mask)]
    for cfg, x, m in cases:
        want = generate(same_weights("sdpa"), x, cfg, attention_mask=m)
        model = same_weights(attn)
        got = generate(model, x, cfg, attention_mask=m)
        assert torch.equal(got.sequences, want.sequences)
        assert model.lm.config._attn_implementation == attn


def test_mask_free_calls_keep_the_models_own_attention(monkeypatch):
    """A flash-like implementation (registered here: flash kernels need a GPU) runs the mask-free NTP
    calls itself; only the calls with a custom mask switch to sdpa. The tokens are sdpa's. (A model the
    fused decode call does not take: it attends by itself, rpt/decode_forward/llama_forward.py.)"""
    from transformers import AttentionInterface

    from rpt.decode_forward import llama_forward as decode_model

    monkeypatch.setattr(decode_model, "ARCHITECTURES", {})
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

    seen = []

    def recording_flash(module, query, key, value, attention_mask, **kwargs):
        seen.append((query.shape[2], attention_mask))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("flash_recording", recording_flash)
    ALL_MASK_ATTENTION_FUNCTIONS.register("flash_recording", flash_attention_mask)
    ids, _ = prompts(1, seed=9)
    for cfg in (SamplingConfig(max_new_tokens=10, eos_token_id=[]),
                SamplingConfig(max_new_tokens=10, rpt_iters=1, rpt_window=2, confidence=0.0)):
        seen.clear()
        want = generate(same_weights("sdpa"), ids, cfg)
        got = generate(same_weights("flash_recording"), ids, cfg)
        assert torch.equal(got.sequences, want.sequences)
        layers, steps = 2, got.stats["forward_passes"] - 1
        assert all(m is None and q == 1 for q, m in seen)  # only mask-free 1-query steps ran on it
        if cfg.rpt_iters:  # most calls carry PTP chains and a mask: those ran with sdpa, not recorded
            assert 0 < len(seen) < layers * steps
        else:  # NTP: every call after the (masked) prefill is mask-free, and runs on the model's kernel
            assert len(seen) == layers * steps


def test_unknown_attention_implementation_is_a_clear_error():
    model = same_weights("paged|sdpa")
    ids, mask = prompts(1)
    with pytest.raises(ValueError, match=r"'paged\|sdpa'.*sdpa"):
        generate(model, ids, SamplingConfig(max_new_tokens=3, rpt_iters=1, rpt_window=2))


# ---- torch.compile -------------------------------------------------------------------------------
COMPILE_CONFIGS = (SamplingConfig(max_new_tokens=8, rpt_iters=2, rpt_window=2, confidence=0.0),
                   SamplingConfig(max_new_tokens=8, rpt_iters=1, rpt_window=2, confidence=0.2, temperature=1.0, seed=1))


def compile_case(backend, configs=COMPILE_CONFIGS):
    model = rpt_model(2).float()
    ids, mask = prompts(3, seed=12)
    for cfg in configs:
        eager = generate(model, ids, cfg, attention_mask=mask)
        compiled = generate(model, ids, cfg, attention_mask=mask, compile=backend)
        assert torch.equal(eager.sequences, compiled.sequences)
        assert eager.stats["forward_passes"] == compiled.stats["forward_passes"]


def test_compile_fixed_shapes_trace():
    """The fixed-shape step (bucketed query blocks over the whole cache) traced by dynamo gives the
    eager tokens; ``make test-slow`` also runs the inductor backend (minutes on 2 cores)."""
    torch._dynamo.reset()
    # greedy k = 2 over ragged rows (per-row steps only); sampled k = 1 over 3 ragged rows compiles in
    # test_compiled_ntp.py's processors test (rpt_iters=1) and test_compiled_rpt.py
    compile_case("eager", COMPILE_CONFIGS[:1])


# slow (15 s): test_compiled_ntp.py's widths-share-one-graph test keeps the guarantee in the default suite
@pytest.mark.slow
def test_compile_over_many_prompt_widths_never_falls_back_to_eager(models):
    """12 batches of different widths across four capacity buckets: the same tokens as eager, a
    bounded set of graphs, and no ``recompile_limit`` (past it dynamo silently runs the step eagerly)."""
    import logging

    from torch._dynamo.utils import counters

    class Messages(logging.Handler):
        def __init__(self):
            super().__init__()
            self.seen = []

        def emit(self, record):
            self.seen.append(record.getMessage())

    torch._dynamo.reset()
    counters.clear()
    messages, dynamo_log = Messages(), logging.getLogger("torch._dynamo")
    dynamo_log.addHandler(messages)
    model = models[2].float()
    graphs = {}
    try:
        for k in (1, 0):  # RPT through the per-row driver, NTP through the batch-flat path
            cfg = SamplingConfig(max_new_tokens=4, rpt_iters=k, rpt_window=2, confidence=0.3, eos_token_id=[])
            counters.clear()
            for width in (3, 4, 5, 40, 41, 42, 90, 91, 92, 180, 181, 182):
                # NTP with one row: a [1, 1] slice of the layout counts as contiguous whatever its strides
                ids = torch.randint(0, V, (2 if k else 1, width), generator=torch.Generator().manual_seed(width))
                eager, compiled = generate(model, ids, cfg), generate(model, ids, cfg, compile="eager")
                assert torch.equal(eager.sequences, compiled.sequences)
            graphs[k] = counters["stats"]["unique_graphs"]
    finally:
        dynamo_log.removeHandler(messages)
        models[2].double()
        torch._dynamo.reset()
    assert not [m for m in messages.seen if "recompile_limit" in m]
    assert 8 < graphs[1] <= 16  # past the default limit of 8, and bounded
    # not one per width: a step graph per capacity bucket (64, 128, 256) and a prefill graph per query
    # bucket the widths meet (4, 8 and 64 in the first, 128, 256), padded or not: 8
    assert graphs[0] <= 8


@pytest.mark.slow
def test_compile_inductor():
    torch._dynamo.reset()
    compile_case(True)
