r"""The LZ penalty (Ginart et al.): penalise each candidate token by how cheaply LZSS would code it --
the definition, and the match lengths and penalty computed from scratch.

Definition (the per-token LZSS codelength of the cheapest match a candidate would create). Let
:math:`c_1..c_m` be the last ``W`` tokens of the context (:math:`m \le W`). For each position j

* :math:`s_j` = the largest :math:`s \le B` with :math:`c_{j-s..j-1} = c_{m-s+1..m}` (the common
  suffix of the text before :math:`c_j` and of the whole context, inside the window);
* :math:`L_j = s_j + 1` (match length if the next token were :math:`c_j`),
  :math:`D_j = m + 1 - j` (its distance back from the next position);
* :math:`\mathrm{cost}_j = (\log_2(D_j + 1) + \log_2 L_j) / L_j` bits per token.

:math:`\mathrm{cost}(v) = \min_{j: c_j = v} \mathrm{cost}_j` (or :math:`\log_2 V` when v is not in the
window), clamped to :math:`[0, \log_2 V]`, and :math:`\mathrm{penalty}(v) = \log_2 V - \mathrm{cost}(v)`.
Sampling uses :math:`\ell_v \leftarrow \ell_v - \alpha\,\mathrm{penalty}(v)`. Paper defaults:
:math:`\alpha = 0.15, W = 512, B = 32`.

**Variants.** The reference code exists in two versions; ``variant`` picks one (both take W and B).
:func:`lz_penalty` computes either from scratch; as logits processors each is one class over the one
:class:`~rpt.sampling.lz.processor.LZMatcher` (which columns enter the window, their match lengths):
:class:`~rpt.sampling.lz.processor.LZPenaltyLogitsProcessor` (``codelength``) and
:class:`~rpt.sampling.lz.processor.ClosestLongestLZLogitsProcessor`.

* ``"codelength"`` (the default, above): the per-token LZSS cost ``(log2(D + 1) + log2 L) / L``,
  minimised over every occurrence of the candidate -- the paper's formula, which this project
  has always computed. The paper's alpha = 0.15 was tuned on the reference code; which version
  that was is not stated, so compare both when alpha matters.
* ``"closest_longest"`` (the later reference penalizer): among the candidate's occurrences at
  0-based window positions ``j >= B`` (the first B positions are skipped, so every match has B
  tokens before it), take the longest match ``L_j`` and among those the closest;
  :math:`\mathrm{cost}(v) = \log_2 D` of that occurrence (no division by L), clamped to
  :math:`[0, \log_2 V]`; a candidate with no such occurrence, or a window of at most B tokens,
  gets penalty 0.

Cost: the match lengths take one ``[batch, B, W]`` uint8 comparison (the B tokens before each
window column against the context's last B, via ``unfold``; :func:`mismatch_depth`), or O(batch * W)
per step when carried along a decode (:mod:`rpt.sampling.lz.incremental`); ``cost_j`` is a lookup in a
``[B + 1, W]`` table; the per-token minimum is a ``scatter_reduce`` of W values per row. Nothing of
size V x W exists, and the from-scratch path has no host synchronisation (static shapes, no
``.item()``; every branch reads shapes only), so it traces into one ``torch.compile`` graph and can
be captured in a CUDA graph. The processor never builds the ``[batch, V]`` penalty: one scatter-min
of ``logit - penalty_j`` over the <= W window positions rewrites the affected logits
(:mod:`rpt.sampling.lz.logits`).

Layout used throughout: the window's tokens in natural order, right-aligned, so column ``c`` of
``m`` holds ``c_{c+1}`` at distance ``D = m - c``, with at most ``c`` tokens before it.
"""

from __future__ import annotations

import math

import torch

_PAD = -1  # "no token": outside the window, or padding (never equal to a real id)


VARIANTS = ("codelength", "closest_longest")


def check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"LZ variant={variant!r} is invalid: use one of {', '.join(VARIANTS)} (see rpt.sampling.lz.definition)")


def check_sizes(window: int, buffer: int) -> None:
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ValueError(f"LZ window={window!r} is invalid: use an integer >= 1 (paper default 512)")
    if not isinstance(buffer, int) or isinstance(buffer, bool) or buffer < 1:
        raise ValueError(f"LZ buffer={buffer!r} is invalid: use an integer >= 1 (paper default 32)")


_TABLES: dict[tuple[int, int, str], torch.Tensor] = {}
# A server meets many (W, B) settings over its life: keep the most recently used tables, not all.
_MAX_TABLES = 16


def cost_table(window: int, buffer: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[B + 1, W]``: entry ``[s, c] = cost_j`` of a full window's column c (``D = W - c``) with
    match length ``min(s, c)`` (a match cannot start before the window). Read the columns
    ``W - m ..`` for a window of m tokens: ``table[:, W - m:].gather(0, s)``."""
    key = (window, buffer, str(device))
    table = _TABLES.pop(key, None)
    if table is None:
        col = torch.arange(window, dtype=torch.float64)
        length = torch.minimum(torch.arange(buffer + 1, dtype=torch.float64)[:, None], col) + 1
        table = ((torch.log2(window - col + 1) + torch.log2(length)) / length).float().to(device)
    _TABLES[key] = table  # the most recent last
    while len(_TABLES) > _MAX_TABLES:
        del _TABLES[next(iter(_TABLES))]
    return table


_WEIGHTS: dict[tuple[int, torch.dtype, str], torch.Tensor] = {}


def _weights(buffer: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    key = (buffer, dtype, str(device))
    if key not in _WEIGHTS:
        _WEIGHTS[key] = torch.arange(1, buffer + 1, dtype=dtype, device=device)[:, None]
    return _WEIGHTS[key]


def mismatch_depth(source: torch.Tensor, buffer: int) -> torch.Tensor:
    """``B - s`` of each window column, from ``source [rows, B + m]`` int32: the B tokens before
    the window (-1 where there are none; a full window may pass older tokens, see :func:`cost_table`),
    then the window's m tokens. Returns ``[rows, m]``
    (uint8 for B < 256): 0 for a full B-token match.

    For column j, ``source[j + q]`` (q = 0..B-1) are the B tokens before it and ``source[m + q]``
    the context's last B; s is the run of equal pairs counted down from q = B - 1, so
    ``B - s = max_q (q + 1) [mismatch at q]``. Laid out ``[rows, B, m]`` so that the max
    reduces an outer dim (vectorised along m), and written through ``out=`` because a plain
    ``!=`` of this overlapping view returns a permuted layout whose reduction is ~8x slower;
    uint8 and a max in place of a bool argmin make the passes ~3-5x cheaper (1 thread, 8 x 512 x 32).
    """
    rows, m = source.shape[0], source.shape[1] - buffer
    dtype = torch.uint8 if buffer < 256 else torch.int32
    ne = torch.empty((rows, buffer, m), dtype=dtype, device=source.device)
    torch.ne(source.unfold(1, m, 1)[:, :buffer], source[:, m:, None], out=ne)
    return ne.mul_(_weights(buffer, dtype, source.device)).amax(1)


def lz_match_lengths(
    context: torch.Tensor, window: int = 512, buffer: int = 32, lengths: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Match lengths of the window.

    Args:
        context: ``[batch, T]`` token ids >= 0, right-aligned (the last column is the newest token).
        window, buffer: W and B of the definition.
        lengths: optional ``[batch]`` count of real tokens at the right end of each row (the columns
            before them, e.g. left padding, are ignored).

    Returns:
        ``tokens [batch, m]`` = the last ``m = min(T, W)`` columns (gaps set to -1), ``s [batch, m]``
        = ``s_j`` of each column, and ``valid [batch, m]`` (None when every column is real).
    """
    tokens = context[:, -window:]
    m = tokens.shape[1]
    valid = None
    if lengths is not None:
        valid = torch.arange(m, device=tokens.device) >= m - lengths.to(tokens.device).clamp(0, m)[:, None]
        tokens = tokens.masked_fill(~valid, _PAD)
    # Gaps (before the window, or masked) need no care: a run of matches meets "real tail token vs
    # gap" before reaching the tail's own gaps. int32 (ids < 2^31) halves the comparison's traffic.
    source = torch.nn.functional.pad(tokens.to(torch.int32), (buffer, 0), value=_PAD)
    return tokens, buffer - mismatch_depth(source, buffer).long(), valid


def _costs(s: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    return table[:, table.shape[1] - s.shape[1]:].gather(0, s)


def lz_match_costs(
    context: torch.Tensor, window: int = 512, buffer: int = 32, lengths: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Like :func:`lz_match_lengths`, with ``cost_j`` (bits) in place of the match length."""
    tokens, s, valid = lz_match_lengths(context, window, buffer, lengths)
    return tokens, _costs(s, cost_table(window, buffer, tokens.device)), valid


def closest_longest_costs(tokens: torch.Tensor, s: torch.Tensor, valid: torch.Tensor | None, buffer: int,
                          width: int, log_v: float) -> torch.Tensor:
    """``[batch, width]`` costs of the ``closest_longest`` variant (``log2 V`` where a token has no match).

    ``tokens``, ``s``, ``valid`` as :func:`lz_match_lengths` (or
    :class:`~rpt.sampling.lz.incremental.LZMatchTracker`: its ``s`` may exceed the tokens before a
    column, which only columns ``j < B`` can, and they are skipped).
    Two scatters over the window's W positions: the longest match per token, then the closest
    occurrence of that length. Ids >= ``width`` are left out.
    """
    rows, m = tokens.shape
    col = torch.arange(m, device=tokens.device)
    # the first real column (tokens are right-aligned); positions count from it, and the first B are skipped
    start = m - valid.sum(1, keepdim=True) if valid is not None else torch.zeros((rows, 1), dtype=torch.long, device=tokens.device)
    keep = (col[None, :] - start >= buffer) & (tokens >= 0) & (tokens < width)
    if valid is not None:
        keep &= valid
    idx = tokens.clamp(0, width - 1).masked_fill(~keep, 0)
    length = (s + 1).masked_fill(~keep, 0)
    best = torch.zeros((rows, width), dtype=length.dtype, device=tokens.device)
    best.scatter_reduce_(1, idx, length, reduce="amax", include_self=True)
    is_best = keep & (length == best.gather(1, idx)) & (length > 0)
    dist = (m - col)[None, :].expand(rows, m).float()  # D = m + 1 - j (1-based j)
    far = float(m + 1)
    closest = torch.full((rows, width), far, device=tokens.device)
    closest.scatter_reduce_(1, idx, dist.masked_fill(~is_best, far), reduce="amin", include_self=True)
    cost = torch.log2(closest).clamp_(0.0, log_v)
    return cost.masked_fill_(closest >= far, log_v)


def _right_pack(context: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Move each row's real tokens (``mask`` True) to the right end, in order; gaps go left."""
    order = torch.sort(mask.to(torch.int8), dim=1, stable=True).indices
    return context.gather(1, order), mask.sum(dim=1)


def _codelength_window_costs(rows: torch.Tensor, vocab_size: int, window: int, buffer: int,
                             lengths: torch.Tensor | None, log_v: float) -> torch.Tensor:
    """``[batch, V]`` cost of every token, ``codelength`` variant: the minimum ``cost_j`` over its occurrences."""
    out = torch.full((rows.shape[0], vocab_size), log_v, dtype=torch.float32, device=rows.device)
    tokens, cost, valid = lz_match_costs(rows, window, buffer, lengths)
    if valid is not None:  # gaps write log2 V into column 0, which amin then ignores
        cost = cost.masked_fill(~valid, log_v)
        tokens = tokens.clamp(min=0)
    return out.scatter_reduce_(1, tokens, cost, reduce="amin", include_self=True)


def _closest_longest_window_costs(rows: torch.Tensor, vocab_size: int, window: int, buffer: int,
                                  lengths: torch.Tensor | None, log_v: float) -> torch.Tensor:
    """``[batch, V]`` cost of every token, ``closest_longest`` variant (:func:`closest_longest_costs`)."""
    tokens, s, valid = lz_match_lengths(rows, window, buffer, lengths)
    return closest_longest_costs(tokens, s, valid, buffer, vocab_size, log_v)


_WINDOW_COSTS = {"codelength": _codelength_window_costs, "closest_longest": _closest_longest_window_costs}


def lz_penalty(
    context: torch.Tensor,
    vocab_size: int,
    window: int = 512,
    buffer: int = 32,
    lengths: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    variant: str = "codelength",
) -> torch.Tensor:
    """The ``[batch, V]`` LZ penalty (bits, in ``[0, log2 V]``) of the module docstring.

    Args:
        context: ``[batch, T]`` (or ``[T]``) token ids in ``[0, V)``, newest last.
        vocab_size: V.
        window, buffer: W (lookback) and B (maximum match length).
        lengths: ``[batch]`` number of real tokens at the right end of each row (left padding).
        mask: ``[batch, T]`` bool, True for real tokens (any pattern; gaps are squeezed out).
        variant: ``"codelength"`` or ``"closest_longest"`` (module docstring).

    An empty context gives a zero penalty. Output is float32 on the context's device.
    """
    check_sizes(window, buffer)
    check_variant(variant)
    if vocab_size < 1:
        raise ValueError(f"vocab_size={vocab_size} is invalid: use the model's vocabulary size (>= 1)")
    if lengths is not None and mask is not None:
        raise ValueError("pass either lengths or mask, not both")
    if context.dtype.is_floating_point or context.dtype == torch.bool or context.dim() not in (1, 2):
        raise ValueError(f"context must hold integer token ids as [T] or [batch, T], got {context.dtype} "
                         f"{tuple(context.shape)}")
    rows = context if context.dim() == 2 else context[None]
    if mask is not None:
        rows, lengths = _right_pack(rows, mask if mask.dim() == 2 else mask[None])
    log_v = math.log2(vocab_size)
    if rows.shape[1] > 0:
        out = _WINDOW_COSTS[variant](rows, vocab_size, window, buffer, lengths, log_v)
    else:
        out = torch.full((rows.shape[0], vocab_size), log_v, dtype=torch.float32, device=rows.device)
    penalty = log_v - out.clamp_(0.0, log_v)
    return penalty if context.dim() == 2 else penalty[0]
