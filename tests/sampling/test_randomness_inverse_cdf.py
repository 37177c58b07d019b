"""inverse_cdf, the two-level draw and its dispatch, against an independent truth: numpy's sequential
float64 cumsum and a per-row searchsorted (the definition: the first token whose cumulative mass
exceeds u times the total)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rpt.sampling.randomness import _TWO_LEVEL_SIZE, _two_level, inverse_cdf, uniforms

U_MIN, U_MAX = 0.5 / 2**32, 1 - 2.0**-33  # the extreme values of `uniforms` ((h + 0.5) / 2^32)
TOLERANCE = 1e-9  # of the total: where a draw may differ from the sequential cumsum's


def truth(probs: torch.Tensor, u: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, cdf): the sequential float64 cumsum's draw, row by row in numpy."""
    cdf = np.cumsum(probs.double().numpy(), axis=-1)  # numpy adds left to right
    tokens = np.stack([np.searchsorted(row, uu * row[-1], side="right") for row, uu in zip(cdf, u.numpy())])
    return np.minimum(tokens, probs.shape[-1] - 1), cdf


def check(probs: torch.Tensor, u: torch.Tensor, tokens: torch.Tensor) -> int:
    """Assert ``tokens`` never hits a zero-probability token and equals the truth except where the
    target lies within TOLERANCE of the cumulative mass at the boundary between the two; return how
    many draws differ."""
    assert tokens.shape == u.shape and tokens.dtype == torch.long
    drawn = probs.double().gather(-1, tokens)
    assert (drawn > 0).all(), f"zero-probability tokens drawn: {tokens[drawn == 0].tolist()}"
    expected, cdf = truth(probs, u)
    got = tokens.numpy()
    rows, cols = np.nonzero(got != expected)
    total = cdf[:, -1]
    for b, d in zip(rows, cols):
        boundary = cdf[b, min(got[b, d], expected[b, d])]
        gap = abs(u[b, d].item() * total[b] - boundary)
        assert gap < TOLERANCE * total[b], f"row {b} draw {d}: {got[b, d]} vs {expected[b, d]}, gap {gap / total[b]:.3g}"
    return len(rows)


def random_probs(gen: torch.Generator, batch: int, width: int, pattern: str, dtype: torch.dtype) -> torch.Tensor:
    logits = torch.randn(batch, width, generator=gen, dtype=torch.float64) * 3
    probs = torch.softmax(logits, -1)
    if pattern == "sparse":  # ~90% exact zeros, so whole 64-wide chunks are zero too
        probs = probs * (torch.rand(batch, width, generator=gen, dtype=torch.float64) < 0.1)
    elif pattern == "blocks":  # mass in a few 64-wide blocks, zeros in between and at the end
        keep = torch.rand(batch, (width + 63) // 64, generator=gen) < 0.2
        keep[:, -1] = False  # a final chunk of zeros
        keep[:, 0] |= ~keep.any(-1)
        probs = probs * keep.repeat_interleave(64, -1)[:, :width]
    elif pattern == "one":  # all mass in one token
        probs = torch.zeros_like(probs).scatter_(-1, torch.randint(width, (batch, 1), generator=gen), 1.0)
    elif pattern == "last_chunk":  # mass only in the last chunk (its first tokens zero too)
        probs = torch.zeros_like(probs)
        probs[:, -40:] = torch.rand(batch, 40, generator=gen, dtype=torch.float64)
        probs[:, -40:-30] = 0
    elif pattern == "unnormalised":
        probs = probs * 37.5
    probs[0, 0] = 0.0 if pattern != "one" else probs[0, 0]  # a zero first token: u near 0 must skip it
    if probs[0].sum() == 0:
        probs[0, -1] = 1.0
    return probs.to(dtype)


PATTERNS = ["dense", "sparse", "blocks", "one", "last_chunk", "unnormalised"]
DTYPES = [torch.float32, torch.bfloat16, torch.float64]


def cases(seed: int, count: int):
    """``count`` random (probs, u) with shapes [1..64, V], V in {1024, 4096, 4160, 1000}, 1..3 draws,
    every pattern and dtype, u from `uniforms` with the two extremes in the first and last columns."""
    gen = torch.Generator().manual_seed(seed)
    for i in range(count):
        batch = int(torch.randint(1, 65, (), generator=gen))
        width = [1024, 4096, 4160, 1000][i % 4]
        draws = 1 + i % 3
        probs = random_probs(gen, batch, width, PATTERNS[i % len(PATTERNS)], DTYPES[i % len(DTYPES)])
        u = uniforms(torch.randint(0, 2**62, (batch,), generator=gen), i, 0, 0, draws=draws)
        u[0, 0], u[-1, -1] = U_MIN, U_MAX
        yield probs, u


def test_hand_computed_example():
    probs = torch.zeros(2, 1024)
    probs[:, 5], probs[:, 700] = 0.25, 0.75  # cdf 0.25 at 5..699, 1 from 700
    u = torch.tensor([[0.2, 0.25, U_MAX], [U_MIN, 0.2500001, 0.9]], dtype=torch.float64)
    expected = torch.tensor([[5, 700, 700], [5, 700, 700]])
    assert torch.equal(_two_level(probs, u), expected)
    assert torch.equal(inverse_cdf(probs, u), expected)  # the sequential draw: [2, 1024] is small


@pytest.mark.parametrize("seed", [0, 1])
def test_two_level_matches_sequential_cumsum(seed):
    differ = draws = 0
    for probs, u in cases(seed, 60):
        if probs.shape[-1] % 64 == 0:
            differ += check(probs, u, _two_level(probs, u))
            draws += u.numel()
        check(probs, u, inverse_cdf(probs, u))  # the dispatch, V = 1000 and small batches included
    # a random u lands within 1e-9 of a boundary with probability ~1e-9 per token crossed
    assert draws > 2000 and differ <= draws * 1e-3, (differ, draws)


def boundary_uniforms(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """u whose target lands on, just below and just above cumulative masses (the sequential cumsum's
    at random tokens): the draws where the two summation orders may disagree."""
    cdf = probs.double().cumsum(-1)
    at = cdf.gather(-1, torch.randint(probs.shape[-1], (probs.shape[0], 4), generator=gen)) / cdf[:, -1:]
    u = torch.cat([at, torch.nextafter(at, torch.zeros_like(at)), torch.nextafter(at, torch.ones_like(at))], -1)
    return u.clamp(U_MIN, U_MAX)


def test_boundary_draws_never_hit_zero_tokens():
    gen = torch.Generator().manual_seed(2)
    differ = 0
    for i in range(40):
        probs = random_probs(gen, 32, [1024, 4096, 4160][i % 3], ["sparse", "blocks", "last_chunk", "dense"][i % 4],
                             DTYPES[i % 3])
        u = boundary_uniforms(probs, gen)
        differ += check(probs, u, _two_level(probs, u))  # check() allows a difference only at a boundary
        check(probs, u, inverse_cdf(probs, u))
    assert differ < 0.25 * 40 * 32 * 12  # most boundary draws still agree (measured: 9%)


def test_extreme_uniforms_draw_the_first_and_last_nonzero_tokens():
    gen = torch.Generator().manual_seed(3)
    for pattern in ["sparse", "blocks", "last_chunk"]:
        probs = random_probs(gen, 16, 4096, pattern, torch.float32)
        nonzero = probs > 0
        first = nonzero.int().argmax(-1)
        last = 4095 - nonzero.flip(-1).int().argmax(-1)
        u = torch.tensor([[U_MIN, U_MAX]], dtype=torch.float64).expand(16, 2)
        assert torch.equal(_two_level(probs, u), torch.stack([first, last], -1)), pattern


def test_chunk_sum_rounding_above_the_chunk_cumsum_falls_back_to_its_last_nonzero_token():
    # The first level's vectorised chunk sum can round above the chunk's own sequential cumsum: here
    # 1 + 40 * 2^-53 is 1 added left to right (each 2^-53 is half an ulp of 1, rounded to even) but
    # more than 1 summed in lanes. A target between the two (u just below 1) then exceeds nothing
    # inside the chosen chunk, and the draw must be its last nonzero token, not a trailing zero.
    probs = torch.zeros(1, 1024, dtype=torch.float64)
    probs[0, 0], probs[0, 1:41] = 1.0, 2.0**-53
    chunk_sum = probs[:, :64].sum(-1).item()
    assert chunk_sum > probs[0, :64].cumsum(0)[-1].item() == 1.0, "torch's sum added left to right here"
    u = torch.tensor([[1 - 2.0**-53]], dtype=torch.float64)
    assert u.item() * chunk_sum >= 1.0  # the target: past the chunk's sequential cumsum
    assert _two_level(probs, u).item() == 40
    check(probs, u, _two_level(probs, u))  # 0 by the sequential cumsum: within rounding of its boundary
    # u = 1 (above every `uniforms` value): the target is the total and, as the sequential draw's
    # clamp gives V - 1, the last chunk's last token (the all-zero case only)
    probs = torch.zeros(1, 1024)
    probs[0, 100:110] = 0.1
    assert _two_level(probs, torch.ones(1, 1, dtype=torch.float64)).item() == 1023


def test_dispatch_by_size_and_width():
    # the two-level path only where it pays (measured) and V is a multiple of 64; both give the truth
    probs = torch.softmax(torch.randn(32, 4096, generator=torch.Generator().manual_seed(4)), -1)
    assert probs.numel() >= _TWO_LEVEL_SIZE and torch.randn(1, 4096)[:, :1000].numel() < _TWO_LEVEL_SIZE
    u = uniforms(torch.arange(32), 0, 0, 0, draws=2)
    assert check(probs, u, inverse_cdf(probs, u)) == 0
    assert check(probs[:, :4000], u, inverse_cdf(probs[:, :4000], u)) == 0  # not a multiple of 64


def test_under_torch_compile_fullgraph():
    gen = torch.Generator().manual_seed(5)
    compiled = torch.compile(inverse_cdf, fullgraph=True, backend="aot_eager", dynamic=False)
    for pattern in ["blocks", "dense"]:
        probs = random_probs(gen, 64, 4096, pattern, torch.float32)
        u = uniforms(torch.arange(64), 9, 0, 0, draws=3)
        assert torch.equal(compiled(probs, u), inverse_cdf(probs, u)), pattern


# dynamo's eager backend traces the step the draw sits in (test_under_torch_compile_fullgraph: aot_eager)
@pytest.mark.parametrize("rpt_iters, compile", [(0, "eager"), (1, False)])
def test_decodes_at_batch_size_draw_what_the_sequential_cumsum_draws(monkeypatch, rpt_iters, compile):
    """Whole sampled decodes where every draw is two-level (V = 4096, 32 rows: the benchmark's micro
    Llama), the compiled NTP step included, emit the tokens of the same decodes with the sequential
    cumsum's draw (the two-level path switched off)."""
    from benchmarks.host_overhead import MICRO, micro_model
    from rpt.sampling import SamplingConfig, generate, randomness

    model = micro_model()
    prompt = torch.randint(0, MICRO["vocab_size"], (32, 8), generator=torch.Generator().manual_seed(6))
    cfg = SamplingConfig(max_new_tokens=12, eos_token_id=[], temperature=1.0, seed=7, rpt_iters=rpt_iters,
                         rpt_window=2, confidence=0.9)
    assert prompt.shape[0] * MICRO["vocab_size"] >= _TWO_LEVEL_SIZE
    two_level = generate(model, prompt, cfg, compile=compile).sequences
    monkeypatch.setattr(randomness, "_TWO_LEVEL_SIZE", 2**62)
    sequential = generate(model, prompt, cfg, compile=compile).sequences
    assert torch.equal(two_level, sequential)


@pytest.mark.slow
def test_under_inductor():
    """Inductor generates its own sum and cumsum loops (another summation order than eager's): the
    truth within rounding, no zero token, boundary draws included (about a minute of C++ compilation)."""
    torch._dynamo.reset()
    compiled = torch.compile(inverse_cdf, fullgraph=True, backend="inductor", dynamic=False)
    gen = torch.Generator().manual_seed(8)
    for pattern in ["blocks", "dense", "sparse", "last_chunk"]:
        probs = random_probs(gen, 64, 4096, pattern, torch.float32)
        u = torch.cat([uniforms(torch.arange(64), 9, 0, 0, draws=3), boundary_uniforms(probs, gen)], -1)
        u[0, 0], u[-1, -1] = U_MIN, U_MAX
        check(probs, u, compiled(probs, u))
