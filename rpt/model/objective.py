"""The permuted-window objective of RPT training (Gat et al., "Corrector Sampling", Sec. 2.1).

Pure tensor functions: no model, no I/O.

Notation (1-based, as in the paper, wherever an index faces the user):

* ``sigma`` -- the order in which tokens are fed: the i-th input is ``x[sigma_i]``. A *swap* at
  start ``k`` pushes token ``k`` ``w-1`` places to the right (eq. 9):
  ``(..., k-1, k+1, ..., k+w-1, k, k+w, ...)``.
* ``tau`` -- the index of the target of the i-th output (eq. 10): ``i+1`` when the first ``i``
  inputs are exactly ``{1..i}``, else ``k`` (the token that was pushed right).
* ``tau - sigma`` takes values in ``{1, -1, ..., -(w-1), w}``: ``1`` for ordinary next-token
  prediction, ``-l`` for the l-th token of a window predicting the pushed-back token (PTP-l: the
  target is l places before the newest input), and ``w`` for the pushed token itself, which
  predicts ``x[k+w]`` with the whole prefix seen (NTP again).

The learned offset table has ``w+1`` rows; :func:`offset_to_row` fixes the row order so that the
row index of a PTP-l position is ``l``, the NTP row is 0 and the "+w" row is ``w``.

**The first position never moves.** Swap starts are drawn from ``k >= 2`` so that
``position_ids[:, 0] == 0`` always holds: flash-attention-2 (and transformers' packed-sequence
detection) read a position id of 0 as the start of a new packed document, so a permutation
that moved token 1 would silently cut the sequence in two. The paper traverses from ``k = 1``;
skipping one index out of thousands changes the expected number of swaps negligibly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

IGNORE_INDEX = -100


def _check_window(window: int) -> None:
    if not isinstance(window, int) or window < 2:
        raise ValueError(f"window must be an integer >= 2 (got {window!r}); w=2 swaps adjacent tokens, the paper uses w=3")


def _check_probability(name: str, value: float) -> None:
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1] (got {value!r})")


def sample_swap_starts(length: int, window: int, q: float, generator: torch.Generator | None = None) -> list[int]:
    """The paper's left-to-right procedure (Sec. 2.1, "Training"), literally.

    Traverse ``k = 2, 3, ...``; at each ``k`` whose window ``k..k+w-1`` fits in ``1..length``,
    with probability ``q`` make ``k`` a swap start and continue at ``k + w`` (windows never
    overlap), otherwise continue at ``k + 1``. Returns the 1-based starts in increasing order.

    This is the reference definition; :func:`make_rpt_batch` draws from the same distribution
    without a Python loop (see :func:`sample_swap_start_mask`).
    """
    _check_window(window)
    _check_probability("q", q)
    starts: list[int] = []
    k = 2
    while k + window - 1 <= length:
        if torch.rand((), generator=generator).item() < q:
            starts.append(k)
            k += window
        else:
            k += 1
    return starts


def expected_swaps(length: int, window: int, q: float) -> float:
    """Exact expected number of swap starts of :func:`sample_swap_starts` (dynamic programming).

    ``f(k) = q (1 + f(k+w)) + (1-q) f(k+1)`` for windows that fit, ``0`` beyond. For n=4096,
    w=3, q=0.02 this is about 78.7 -- the paper's "80 expected swaps" (Sec. 5.1).
    """
    f = [0.0] * (length + window + 2)
    for k in range(length - window + 1, 1, -1):
        f[k] = q * (1.0 + f[k + window]) + (1.0 - q) * f[k + 1]
    return f[2] if length >= window + 1 else 0.0


Generators = torch.Generator | Sequence[torch.Generator] | None


def uniforms(shape: tuple[int, ...], generator: Generators, device: torch.device | str | None = None) -> torch.Tensor:
    """Uniforms of ``shape`` (``[batch, ...]``) on ``device``: from one generator, or -- given one generator
    per row -- row ``r`` from ``generator[r]`` alone, so that a row's draws do not depend on the rows
    drawn with it (training keys them per sequence of the global batch, whatever the micro-batch)."""
    if isinstance(generator, Sequence):
        if len(generator) != shape[0]:
            raise ValueError(f"{len(generator)} generators for {shape[0]} rows; give one per row")
        return torch.stack([torch.rand(shape[1:], generator=g, device=g.device) for g in generator]).to(device)
    return torch.rand(shape, generator=generator, device=generator.device if generator is not None else device).to(device)


def sample_swap_start_mask(
    batch: int, length: int, window: int, q: float, generator: Generators = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Vectorised draw of the left-to-right procedure: a ``[batch, length]`` bool mask of starts.

    The procedure is a renewal process: after a start at ``k`` (or at the beginning, ``k = 2 -
    w`` conceptually) it tests indices ``k+w, k+w+1, ...`` with independent coins, so the next
    start is ``k + w + G`` with ``G ~ Geometric(q)`` failures. Drawing all gaps at once and
    taking a cumulative sum gives exactly the procedure's distribution with no loop over tokens.
    """
    _check_window(window)
    _check_probability("q", q)
    mask = torch.zeros(batch, length, dtype=torch.bool, device=device)
    if q <= 0.0 or length < window + 1:
        return mask
    max_starts = (length - 1) // window + 1
    u = uniforms((batch, max_starts), generator, device)
    if q >= 1.0:
        gaps = torch.zeros_like(u, dtype=torch.long)
    else:
        # Inverse-CDF geometric: number of failures before the first success.
        gaps = torch.floor(torch.log1p(-u) / torch.log1p(torch.tensor(-q, dtype=u.dtype, device=u.device))).long()
    # 1-based start of the j-th swap: 2 + sum_{i<=j} gaps_i + (j-1) w.
    steps = gaps + window
    steps[:, 0] -= window
    starts = 2 + torch.cumsum(steps, dim=1)
    valid = starts + window - 1 <= length
    # Invalid starts point at a dummy column that is dropped afterwards.
    cols = torch.where(valid, starts - 1, torch.full_like(starts, length))
    padded = torch.zeros(batch, length + 1, dtype=torch.bool, device=mask.device)
    padded.scatter_(1, cols, True)
    return padded[:, :length]


def offset_to_row(offset: torch.Tensor, window: int) -> torch.Tensor:
    """Row of the offset table for ``tau - sigma``: ``1 -> 0``, ``-l -> l``, ``w -> w``."""
    return torch.where(offset == 1, torch.zeros_like(offset), torch.where(offset < 0, -offset, offset))


def _window_layout(start_mask: torch.Tensor, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each position, its 0-based place ``d`` inside a swap window and whether it is in one."""
    length = start_mask.shape[-1]
    idx = torch.arange(1, length + 1, device=start_mask.device).expand_as(start_mask)
    last_start = torch.cummax(torch.where(start_mask, idx, torch.zeros_like(idx)), dim=-1).values
    d = idx - last_start
    in_window = (last_start > 0) & (d < window)
    return d, in_window


def permutation_from_mask(start_mask: torch.Tensor, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sigma, tau)``, 1-based, for every row of a ``[..., n]`` mask of non-overlapping starts."""
    _check_window(window)
    length = start_mask.shape[-1]
    idx = torch.arange(1, length + 1, device=start_mask.device).expand_as(start_mask)
    d, in_window = _window_layout(start_mask, window)
    last = d == window - 1
    # Inside a window starting at k: positions k..k+w-2 feed x_{p+1} and predict x_k; the last
    # position feeds x_k and predicts x_{k+w} (eqs. 9-11).
    sigma = torch.where(in_window & ~last, idx + 1, torch.where(in_window & last, idx - (window - 1), idx))
    tau = torch.where(in_window & ~last, idx - d, idx + 1)
    return sigma, tau


def window_permutation(
    length: int, starts: list[int] | torch.Tensor, window: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sigma, tau)`` (1-based LongTensors of size ``length``) for the given swap starts.

    ``window_permutation(8, [3], 2)`` gives sigma ``[1,2,4,3,5,6,7,8]`` and ``tau - sigma``
    ``[1,1,-1,2,1,1,1,1]`` (the paper's Fig. 2).
    """
    _check_window(window)
    starts = torch.as_tensor(list(starts) if not torch.is_tensor(starts) else starts, dtype=torch.long)
    if length < window:
        raise ValueError(f"a sequence of length {length} is shorter than the window {window}; use longer sequences or a smaller window")
    if starts.numel():
        s = torch.sort(starts).values
        if int(s[0]) < 1 or int(s[-1]) + window - 1 > length:
            raise ValueError(f"swap starts {s.tolist()} must lie in 1..{length - window + 1} so each window fits in the sequence")
        if s.numel() > 1 and int(torch.diff(s).min()) < window:
            raise ValueError(f"swap windows overlap: starts {s.tolist()} must be at least window={window} apart")
    mask = torch.zeros(length, dtype=torch.bool)
    mask[starts - 1] = True
    return permutation_from_mask(mask, window)


@dataclass
class RPTBatch:
    """Model inputs for the permuted-window objective; every tensor is ``[batch, n]``.

    ``position_ids`` are 0-based (``sigma - 1``); ``offset_ids`` index the offset table;
    ``kinds`` is 0 for NTP and ``l`` for PTP-l; ``labels`` is ``x[tau]`` or -100.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    offset_ids: torch.Tensor
    labels: torch.Tensor
    kinds: torch.Tensor

    def to(self, device: torch.device | str) -> RPTBatch:
        return RPTBatch(**{k: v.to(device, non_blocking=True) for k, v in self.__dict__.items()})

    def split(self, rows: int) -> list[RPTBatch]:
        """Batches of at most ``rows`` rows each, in order."""
        parts = {k: v.split(rows) for k, v in self.__dict__.items()}
        return [RPTBatch(**{k: p[i] for k, p in parts.items()}) for i in range(len(parts["input_ids"]))]


def ntp_batch(input_ids: torch.Tensor, num_inputs: int | None = None) -> RPTBatch:
    """The identity permutation: plain next-token prediction in the same format."""
    total = input_ids.shape[-1]
    n = total if num_inputs is None else num_inputs
    sigma = torch.arange(1, n + 1, device=input_ids.device).expand(input_ids.shape[0], n)
    return _assemble(input_ids, sigma, sigma + 1, window=2)


def _assemble(input_ids: torch.Tensor, sigma: torch.Tensor, tau: torch.Tensor, window: int) -> RPTBatch:
    total = input_ids.shape[-1]
    fed = torch.gather(input_ids, 1, sigma - 1)
    has_target = tau <= total
    labels = torch.gather(input_ids, 1, (tau.clamp(max=total) - 1))
    labels = torch.where(has_target, labels, torch.full_like(labels, IGNORE_INDEX))
    rows = offset_to_row(tau - sigma, window)
    kinds = torch.where(rows < window, rows, torch.zeros_like(rows))
    return RPTBatch(input_ids=fed, position_ids=sigma - 1, offset_ids=rows, labels=labels, kinds=kinds)


def make_rpt_batch(
    input_ids: torch.Tensor,
    window: int,
    s: float,
    q: float,
    generator: Generators = None,
    num_inputs: int | None = None,
) -> RPTBatch:
    """Build the permuted-window training batch for ``input_ids`` (``[batch, total]``).

    Each row is permuted with probability ``s``; a permuted row gets swap windows drawn by the
    left-to-right procedure with probability ``q`` per index (expected count:
    :func:`expected_swaps`); ``generator`` may be one per row (see :func:`uniforms`). The first
    ``num_inputs`` tokens (default: all) are fed; targets are read from all ``total`` tokens, so with
    ``total = num_inputs + 1`` (a packed chunk of ``seq_len + 1``) every position has a label, and with
    ``num_inputs = total`` the last one is -100 like a Hugging Face causal-LM batch.
    """
    _check_window(window)
    _check_probability("s", s)
    _check_probability("q", q)
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {tuple(input_ids.shape)}")
    batch, total = input_ids.shape
    n = total if num_inputs is None else int(num_inputs)
    if not 1 <= n <= total:
        raise ValueError(f"num_inputs={n} must be between 1 and the sequence length {total}")
    if n < window:
        raise ValueError(
            f"sequences of {n} tokens are shorter than the window {window}; use seq_len >= window or a smaller window"
        )
    device = input_ids.device
    permuted_rows = uniforms((batch,), generator, device) < s
    mask = sample_swap_start_mask(batch, n, window, q, generator=generator, device=device)
    mask &= permuted_rows[:, None]
    sigma, tau = permutation_from_mask(mask, window)
    return _assemble(input_ids, sigma, tau, window)
