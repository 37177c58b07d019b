r"""Randomness keyed by position: every draw a pure function of (row seed, position, iteration, kind).

A sampled token is the inverse CDF of its distribution at one uniform ``u``, and ``u`` is a
counter-based hash of the draw's key, not the next number of a stream. So a draw does not depend
on the order in which a decoder makes its draws, on how many it makes, or on the other rows of
the batch: the cached decoder and the uncached reference emit the same tokens, and row b of a
batch emits what it emits alone with the same row seed.

Keys: ``position`` is the 0-based index of the token in its own row (prompt tokens first, no
padding), ``iteration`` is the RPT iteration (0 = the first NTP proposal of ``x_t``, i = the
re-proposal after sweep i, and the PTP proposals of sweep i), ``kind`` is :data:`NTP` or the
PTP lag ``l = t - j`` of the window position being resampled.

The hash works on int64 tensors holding 32-bit values and multiplies only by constants below
2^31, so no product overflows; it runs on any device and inside ``torch.compile``.
"""

from __future__ import annotations

import torch

NTP = 0  # kind of an NTP draw; a PTP draw of lag l has kind l
_MASK32 = 0xFFFFFFFF
_MULT = 0x45D9F3B  # odd, < 2^31: x * _MULT < 2^63 for x < 2^32


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche (xor-shift-multiply, three rounds) on int64 tensors in ``[0, 2^32)``."""
    for _ in range(3):
        x = x ^ (x >> 16)
        x = (x * _MULT) & _MASK32
    return x ^ (x >> 16)


def _absorb(h: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Fold a 64-bit value into the running hash, 31 bits at a time."""
    for shift in (0, 31, 62):
        h = _mix(h ^ ((value >> shift) & 0x7FFFFFFF) ^ (shift << 24))
    return h


def uniforms(seeds: torch.Tensor, position, iteration, kind, draws: int = 1) -> torch.Tensor:
    """``[batch, draws]`` float64 uniforms in (0, 1): draw d of row b has the key
    ``(seeds[b], position[b], iteration[b] + d, kind[b])``.

    ``position``, ``iteration`` and ``kind`` are ints or ``[batch]`` integer tensors.
    """
    device = seeds.device

    def column(x) -> torch.Tensor:
        if isinstance(x, torch.Tensor):
            return x.to(device=device, dtype=torch.long).reshape(-1, 1)
        return torch.full((seeds.shape[0], 1), int(x), dtype=torch.long, device=device)  # a fill, no copy

    its = column(iteration) + torch.arange(draws, device=device)
    h = torch.full_like(its, 0x2545F491)
    for part in (column(seeds), column(position), its, column(kind)):
        h = _absorb(h, part.expand_as(its))
    return (h.double() + 0.5) / 4294967296.0


_CHUNK = 64  # the two-level draw's chunk width: one 64-wide cumsum per draw
# Below this many probabilities the two-level draw's dozen small ops cost more than the cumsum they
# save (1 thread: 65 vs 18 us at [1, 4096], 96 vs 82 at [16, 4096], 118 vs 146 at [32, 4096],
# 110 vs 144 at [1, 128256]; benchmarks/inverse_cdf.py)
_TWO_LEVEL_SIZE = 96 * 1024


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Tokens ``[batch, draws]`` with ``P(token = v) = probs[b, v]`` (unnormalised is fine) at uniforms
    ``u [batch, draws]`` (in ``[0, 1)``): the first v whose cumulative mass exceeds ``u`` times the
    total. A token of probability 0 is never drawn (its cumulative mass equals its predecessor's).

    On the CPU, where V is a multiple of 64 and ``[batch, V]`` large (see ``_TWO_LEVEL_SIZE``), the
    draw is two-level, as :func:`first_argmax <rpt.sampling.proposals.first_argmax>` is: torch's CPU
    cumsum is a scalar loop over two fresh float64 ``[batch, V]`` tensors (the largest host cost of
    a sampled step) while a sum is vectorised, so the float64 masses of 64-wide chunks, their
    cumsum, the chunk holding the target, and the cumsum of that chunk's 64 probabilities only
    (``[64, 4096]``, 1 thread: 0.16-0.8 ms against 0.27-1.8 ms, the ends set by whether the
    allocator faults the float64 pages in again; benchmarks/inverse_cdf.py). The sums are
    added in another order than one sequential cumsum's, so the token can differ from the sequential
    draw's only where ``u`` times the total lies within float64 rounding (~1e-16 of the total) of a
    token's cumulative mass; never a zero-probability token. No host synchronisation, no
    data-dependent Python: it runs inside ``torch.compile(fullgraph=True)``. Elsewhere (CUDA, where
    cumsum is a parallel scan; small or odd V) the sequential draw.
    """
    if probs.device.type != "cpu" or probs.shape[-1] % _CHUNK or probs.numel() < _TWO_LEVEL_SIZE:
        return _sequential(probs, u)
    return _two_level(probs, u)


def _sequential(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    cdf = probs.double().cumsum(-1)
    # u < 1 - 2^-33 keeps the target below the total, so a draw past the last nonzero token still
    # lands on it (the first cumulative mass equal to the total); the clamp only catches u = 1 or a
    # total of 0
    target = u * cdf[:, -1:]
    return torch.searchsorted(cdf, target, right=True).clamp_(max=probs.shape[-1] - 1)


def _two_level(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    batch, width = probs.shape
    count = width // _CHUNK
    chunks = probs.reshape(batch, count, _CHUNK)
    # chunk masses in float64 (torch casts the input first: one float64 [batch, V] temporary, no cumsum)
    ends = chunks.sum(-1, dtype=torch.float64).cumsum(-1)  # the cumulative mass at each chunk's end
    target = u * ends[:, -1:]
    # The first chunk whose end exceeds the target. An all-zero chunk ends where its predecessor
    # does (x + 0.0 is x), so it is never the first: as in _sequential, one level down.
    chunk = torch.searchsorted(ends, target, right=True).clamp_(max=count - 1)
    # the mass before the chunk: exactly the end the search compared (not end - sum), so base <= target
    base = torch.nn.functional.pad(ends, (1, 0)).gather(1, chunk)
    inside_probs = chunks[torch.arange(batch, device=probs.device)[:, None], chunk]  # [batch, draws, 64]
    cdf = inside_probs.cumsum(-1, dtype=torch.float64).add_(base[..., None])
    # A zero token inside the chunk has the cdf of its predecessor (or base <= target for the first),
    # so it is never the first to exceed the target. But the chunk's own sequential sum may round
    # below the vectorised chunk sum the first level used: then nothing inside exceeds the target
    # (index 64), and the draw is the chunk's last nonzero token (the last token if the chunk is all
    # zero, u = 1 or a zero total only: -1 % 64 = 63, as _sequential's clamp gives V - 1).
    inside = torch.searchsorted(cdf, target[..., None], right=True)[..., 0]
    positions = torch.arange(_CHUNK, device=probs.device)
    last = torch.where(inside_probs > 0, positions, -1).amax(-1) % _CHUNK
    return chunk * _CHUNK + torch.minimum(inside, last)


def row_seed(seed: int, row: int) -> int:
    """The seed of row ``row`` of a run seeded ``seed``: a hash of the pair, in ``[0, 2^62)``.

    Not ``seed + row``: then the run with seed 1 would share all but one row's draws with the run
    with seed 0 (its row b is their row b + 1), and samples collected one call per seed would be
    mostly duplicates. Hashed, runs with different seeds share no row seed (up to 2^-62 collisions).
    """
    return _row_seeds(seed, torch.tensor([int(row)]))[0]


def _row_seeds(seed: int, rows: torch.Tensor) -> list[int]:
    h = _absorb(torch.full_like(rows, 0x1B873593), torch.full_like(rows, int(seed) % 2**63))
    h = _absorb(h, rows)
    low = _absorb(h, torch.full_like(rows, 0x5BD1E995))  # a second 32-bit word: 62 bits in all
    return ((h << 30) ^ low).tolist()


def row_seeds(seed: int | None, batch: int, given=None) -> list[int]:
    """Per-row seeds: ``given`` (one per row), else :func:`row_seed` ``(seed, b)``, else the same with a
    base drawn from torch's global generator (so ``torch.manual_seed`` makes an unseeded run repeatable)."""
    if given is not None:
        seeds = [int(s) for s in given]
        if len(seeds) != batch:
            raise ValueError(f"row_seeds has {len(seeds)} seeds for a batch of {batch} prompts; give one per row")
        return seeds
    base = int(torch.randint(0, 2**62, ())) if seed is None else int(seed)
    return _row_seeds(base, torch.arange(batch))
