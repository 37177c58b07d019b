r"""The LZ penalty (Ginart et al.): penalise each candidate token by how cheaply LZSS would code it.

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
Each is one processor class over the one :class:`LZMatcher` (which columns enter the window, their
match lengths): :class:`LZPenaltyLogitsProcessor` (``codelength``) and
:class:`ClosestLongestLZLogitsProcessor`; :func:`lz_penalty` computes either from scratch.

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
per step when carried along a decode (:class:`LZMatchTracker`); ``cost_j`` is a lookup in a
``[B + 1, W]`` table; the per-token minimum is a ``scatter_reduce`` of W values per row. Nothing of
size V x W exists, and the from-scratch path has no host synchronisation (static shapes, no
``.item()``; every branch reads shapes only), so it traces into one ``torch.compile`` graph and can
be captured in a CUDA graph. The processor never builds the ``[batch, V]`` penalty: one scatter-min
of ``logit - penalty_j`` over the <= W window positions rewrites the affected logits.

Layout used throughout: the window's tokens in natural order, right-aligned, so column ``c`` of
``m`` holds ``c_{c+1}`` at distance ``D = m - c``, with at most ``c`` tokens before it.
"""

from __future__ import annotations

import math

import torch
from transformers import LogitsProcessor

_PAD = -1  # "no token": outside the window, or padding (never equal to a real id)


VARIANTS = ("codelength", "closest_longest")


def _check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"LZ variant={variant!r} is invalid: use one of {', '.join(VARIANTS)} (see rpt.sampling.lz)")


def _check_sizes(window: int, buffer: int) -> None:
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

    ``tokens``, ``s``, ``valid`` as :func:`lz_match_lengths` (or :class:`LZMatchTracker`: its ``s``
    may exceed the tokens before a column, which only columns ``j < B`` can, and they are skipped).
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
    _check_sizes(window, buffer)
    _check_variant(variant)
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


def grow_matches(tokens: torch.Tensor, s: torch.Tensor, new: torch.Tensor, buffer: int) -> torch.Tensor:
    r"""One token ``new [rows, 1]`` appended after the window ``tokens [rows, m]`` with match lengths
    ``s``: ``grown[:, c]`` = :math:`[t_c = x]\min(s_c + 1, B)`, the new match length of the token
    that follows column c (``new`` itself for the last column). Gaps (-1) never match."""
    return (s + 1).clamp_(max=buffer).masked_fill_(tokens != new, 0)


def append_token(tokens: torch.Tensor, s: torch.Tensor, new: torch.Tensor, buffer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`grow_matches` in a fixed-width window: ``tokens`` right-aligned with -1 gaps, the oldest
    column dropped. The token that follows column c moves to column c, so the new ``s`` is ``grown``
    as it stands. O(rows * W); ``s`` may exceed the tokens before a column of a full window, which
    :func:`cost_table` caps (as :class:`LZMatchTracker`)."""
    grown = grow_matches(tokens, s, new, buffer)
    return torch.cat([tokens[:, 1:], new.to(tokens.dtype)], 1), grown


def penalty_table(alpha: float, window: int, buffer: int, log_v: float,
                  device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """``alpha * max(log2 V - cost, 0)`` of :func:`cost_table` flattened, and ``B * W + c`` (int32)
    for each full-window column c: entry ``base[W - m + j] - W * depth`` is column j's."""
    cost = cost_table(window, buffer, device)
    table = (log_v - cost).clamp_(min=0.0).mul_(alpha).reshape(-1)
    return table, torch.arange(window, dtype=torch.int32, device=device) + buffer * window


def apply_codelength(scores: torch.Tensor, tokens: torch.Tensor, depth: torch.Tensor, table: torch.Tensor,
                     base: torch.Tensor, window: int, rows: torch.Tensor | None = None) -> torch.Tensor:
    """``scores[v] -= max_j pen_j`` over the window columns j holding v (the ``codelength`` variant),
    in place. ``tokens [n, m]`` right-aligned (-1 gaps), ``depth = B - s`` (:func:`mismatch_depth`),
    ``table, base`` from :func:`penalty_table`. ``rows [n]``: the rows of ``scores`` (contiguous)
    that the n windows belong to (default: all, in order); the other rows are not read or written."""
    width = scores.shape[-1]
    # one flat lookup of the [B + 1, W] table (row s = B - depth, column W - m + j); int32
    # index_select, as take is ~2x slower at 2 threads for these 4K entries
    index = torch.add(base[window - tokens.shape[1]:], depth, alpha=-window)
    pen = table.index_select(0, index.view(-1)).view(index.shape)
    # Gaps (-1) and ids the logits cannot hold get penalty 0 at a clamped column, a no-op
    # below. Masked always (O(batch x W)) rather than after a check of tokens.max(): that read
    # would be a host synchronisation, and a graph break under torch.compile.
    idx = tokens.clamp(0, width - 1)
    pen.masked_fill_(idx != tokens, 0.0)
    # min_j (l_v - pen_j) = l_v - max_j pen_j: one scatter-min applies each token's largest
    # penalty however often it occurs (order-free, so deterministic); pen >= 0 makes
    # include_self harmless.
    if rows is None:
        current = scores.gather(1, idx)
        new = current.sub_(pen) if current.dtype == torch.float32 else (current.float() - pen).to(scores.dtype)
        return scores.scatter_reduce_(1, idx, new, reduce="amin", include_self=True)
    # a subset of rows: flat positions in the [rows, V] logits, so no [n, V] copy is made. Through
    # the row stride: vLLM hands over a slice of a wider buffer, which .view(-1) refuses.
    if scores.stride(-1) != 1:
        raise ValueError("apply_codelength(rows=...) needs logits whose last dimension is contiguous")
    stride = scores.stride(0)
    flat = scores.as_strided(((scores.shape[0] - 1) * stride + width,), (1,))
    where = (rows.to(idx.dtype)[:, None] * stride + idx).view(-1)
    new = (flat[where].float() - pen.view(-1)).to(scores.dtype)
    flat.scatter_reduce_(0, where, new, reduce="amin", include_self=True)
    return scores


def apply_closest_longest(scores: torch.Tensor, tokens: torch.Tensor, s: torch.Tensor, valid: torch.Tensor | None,
                          alpha: float, buffer: int, log_v: float, rows: torch.Tensor | None = None) -> torch.Tensor:
    """``scores -= alpha * (log2 V - cost)`` of the ``closest_longest`` variant
    (:func:`closest_longest_costs`; not a per-position minimum, so dense), in place; ``rows`` as
    :func:`apply_codelength`."""
    width = scores.shape[-1]
    pen = (log_v - closest_longest_costs(tokens, s, valid, buffer, width, log_v)).mul_(alpha).to(scores.dtype)
    if rows is None:
        return scores.sub_(pen)
    return scores.index_add_(0, rows, pen, alpha=-1)


class LZMatchTracker:
    r""":func:`lz_match_lengths` carried from call to call while the context grows by one token.

    Appending ``x`` to the window ``t_0..t_{m-1}`` (natural order), the token after ``t_c`` gains a
    one-token-longer match exactly when ``t_c = x``:
    :math:`s'_{c+1} = [t_c = x]\min(s_c + 1, B)`, and the first token's is 0 (nothing before it in
    the window; :func:`cost_table` keeps every match inside the window). O(batch * W) per step
    instead of O(batch * W * B). A call that does not extend the previous one by one token (new
    batch, a corrected earlier token, a shorter prefix) recomputes from scratch. The check reads
    tensor contents on the host: meant for CPU decoding.
    """

    def __init__(self, window: int, buffer: int) -> None:
        self.window, self.buffer = window, buffer
        self._tokens: torch.Tensor | None = None
        self._s = torch.empty(0, dtype=torch.long)

    def _extends(self, context: torch.Tensor) -> bool:
        seen = self._tokens
        if seen is None or seen.shape[0] != context.shape[0] or seen.device != context.device:
            return False
        prev = context[:, :-1][:, -self.window:]
        return prev.shape == seen.shape and torch.equal(prev, seen)

    def __call__(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``tokens`` and ``s`` as :func:`lz_match_lengths`, except that ``s`` of column c may exceed
        c (a match reaching out of the window); :func:`cost_table` applies ``min(s, c)``."""
        if context.shape[1] > 0 and self._extends(context):
            new = context[:, -1:]
            grown = grow_matches(self._tokens, self._s, new, self.buffer)
            w = self.window
            self._s = torch.cat([grown.new_zeros(grown.shape[0], 1), grown], 1)[:, -w:]
            self._tokens = torch.cat([self._tokens, new], 1)[:, -w:]
        else:
            self._tokens, self._s, _ = lz_match_lengths(context, self.window, self.buffer)
            self._tokens = self._tokens.clone()  # the caller may reuse its buffer
        return self._tokens, self._s


class LZMatcher:
    """The match lengths a processor reads at each call: which columns of ``input_ids`` enter the
    window (``prompt_length``), then :func:`lz_match_lengths` from scratch, or carried along a
    decode by :class:`LZMatchTracker` (``incremental``). Both LZ processors use one."""

    def __init__(self, window: int, buffer: int, prompt_length: int | torch.Tensor = 0,
                 incremental: bool | None = None) -> None:
        if isinstance(prompt_length, torch.Tensor):
            if prompt_length.dim() != 1 or prompt_length.dtype.is_floating_point:
                raise ValueError("prompt_length tensor must be a 1-D integer tensor [batch]")
        elif not isinstance(prompt_length, int) or prompt_length < 0:
            raise ValueError(f"prompt_length={prompt_length!r} is invalid: use an int >= 0 or a [batch] tensor")
        self.window, self.buffer, self.prompt_length, self.incremental = window, buffer, prompt_length, incremental
        self._tracker = LZMatchTracker(window, buffer)

    def context(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The columns that may enter the window and, for per-row prompts, their real lengths."""
        if isinstance(self.prompt_length, int):
            return input_ids[:, self.prompt_length:], None
        if self.prompt_length.device != input_ids.device:  # once; later calls reuse the moved copy
            self.prompt_length = self.prompt_length.to(input_ids.device)
        if self.prompt_length.shape[0] != input_ids.shape[0]:
            raise ValueError(f"prompt_length has {self.prompt_length.shape[0]} rows, input_ids {input_ids.shape[0]}")
        return input_ids, input_ids.shape[1] - self.prompt_length

    def match_lengths(
        self, context: torch.Tensor, lengths: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``tokens``, ``s`` and ``valid`` of the window (:func:`lz_match_lengths`)."""
        # the tracker's extends-check reads tensor contents on the host: opt-in only (see the processor)
        if lengths is None and self.incremental:
            return (*self._tracker(context), None)
        return lz_match_lengths(context, self.window, self.buffer, lengths)

    def depth(
        self, input_ids: torch.Tensor, context: torch.Tensor, lengths: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``tokens``, ``B - s`` (:func:`mismatch_depth`) and ``valid`` of the window."""
        w, b = self.window, self.buffer
        if lengths is None and not self.incremental and context.shape[1] >= w and input_ids.shape[1] >= w + b:
            # A full window reads the B columns before it as they are (prompt or older tokens):
            # cost_table caps a match at the tokens before its column, so no padded copy is needed.
            # Decided from shapes only (host metadata, no synchronisation).
            return context[:, -w:], mismatch_depth(input_ids[:, -(w + b):].to(torch.int32), b), None
        tokens, s, valid = self.match_lengths(context, lengths)
        return tokens, b - s, valid


class LZPenaltyLogitsProcessor(LogitsProcessor):
    r"""Hugging Face logits processor: ``scores[v] -= penalty * lz_penalty(v)`` (see module docstring).

    Args:
        penalty: alpha >= 0 (paper default 0.15; 0 leaves the scores untouched).
        window, buffer: W and B (paper defaults 512 and 32).
        prompt_length: leading columns of ``input_ids`` kept out of the window: an int (the padded
            prompt width, so only generated tokens count, as the reference penalizer), or a LongTensor
            ``[batch]`` per row (e.g. just the left padding, to include the prompt). 0 = everything.
        vocab_size: V in ``log2 V``; defaults to the width of ``scores``. Ids >= the scores width
            are matched but never penalised (they cannot be sampled).
        inplace: modify ``scores`` in place (default): the penalty then costs O(batch x W) beyond
            the caller's own pass over the logits. Hugging Face ``generate`` hands processors a copy
            of the model's logits, so this is safe there, except that ``output_logits=True`` then
            records the penalised logits; pass ``inplace=False`` to leave the given tensor untouched
            (one ``[batch, V]`` copy per call).
        variant: ``"codelength"`` (default) or ``"closest_longest"`` (module docstring): constructing
            this class with ``variant="closest_longest"`` gives a :class:`ClosestLongestLZLogitsProcessor`
            (a dense ``[batch, V]`` penalty); this class itself is the ``codelength`` transform.
        incremental: carry match lengths between calls (:class:`LZMatchTracker`) when the context
            grew by one token (ignored for a per-row ``prompt_length``; meant for CPU). Off by default:
            deciding whether a call extends the previous one reads the tokens on the host (a
            synchronisation every step, a graph break under ``torch.compile``), while the default
            from-scratch path has none, so it runs inside a compiled / CUDA-graph-captured step,
            and costs about 0.8x (random text) / 0.6x (repetitive) one elementwise pass over fresh
            logits at 1 thread, 1.2-1.5x / 0.9-1.3x at 2 threads (2.1-2.6x with
            OMP_WAIT_POLICY=PASSIVE: a thread wake-up per parallel op) (V = 128256, batch 8, quiet 2-core CPU,
            benchmarks/lz_penalty.py). ``None`` is accepted as ``False``.
    """

    variant = "codelength"

    def __new__(cls, *args, variant: str | None = None, **kwargs):
        if cls is LZPenaltyLogitsProcessor and variant is not None:  # the name picks the variant's class, as pathlib.Path its flavour
            _check_variant(variant)
            cls = _PROCESSORS[variant]
        return super().__new__(cls)

    def __init__(
        self,
        penalty: float,
        window: int = 512,
        buffer: int = 32,
        prompt_length: int | torch.Tensor = 0,
        vocab_size: int | None = None,
        inplace: bool = True,
        incremental: bool | None = None,
        variant: str | None = None,
    ) -> None:
        if not isinstance(penalty, (int, float)) or not math.isfinite(penalty) or penalty < 0:
            raise ValueError(f"LZ penalty alpha={penalty!r} is invalid: use alpha >= 0 (paper default 0.15)")
        _check_sizes(window, buffer)
        variant = variant or self.variant
        _check_variant(variant)
        if variant != self.variant:
            raise ValueError(f"{type(self).__name__} is the {self.variant} variant; for {variant} use "
                             f"LZPenaltyLogitsProcessor(..., variant={variant!r})")
        if vocab_size is not None and vocab_size < 1:
            raise ValueError(f"vocab_size={vocab_size!r} is invalid: use None or an integer >= 1")
        self.matcher = LZMatcher(window, buffer, prompt_length, incremental)
        self.penalty, self.window, self.buffer = float(penalty), window, buffer
        self.vocab_size, self.inplace = vocab_size, inplace
        self._table_key: tuple | None = None

    @property
    def prompt_length(self) -> int | torch.Tensor:
        return self.matcher.prompt_length

    @property
    def incremental(self) -> bool | None:
        return self.matcher.incremental

    def _log_v(self, scores: torch.Tensor) -> float:
        return math.log2(self.vocab_size or scores.shape[-1])

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        context, lengths = self.matcher.context(input_ids)
        # (a compiled step's penalty is a tensor, never 0: rpt.sampling.processors' knobs)
        if (isinstance(self.penalty, float) and self.penalty == 0) or context.shape[1] == 0:
            return scores
        return self.apply(input_ids, context, lengths, scores if self.inplace else scores.clone())

    def apply(self, input_ids: torch.Tensor, context: torch.Tensor, lengths: torch.Tensor | None,
              scores: torch.Tensor) -> torch.Tensor:
        """Penalise ``scores`` in place for the window ``context``: here the ``codelength`` variant,
        each token's largest per-position penalty in one scatter-min (:func:`apply_codelength`)."""
        tokens, depth, _ = self.matcher.depth(input_ids, context, lengths)
        table, base = self._penalty_table(self._log_v(scores), scores.device)
        return apply_codelength(scores, tokens, depth, table, base, self.window)

    def _penalty_table(self, log_v: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`penalty_table`, cached."""
        if self._table_key != (log_v, device):
            self._table, self._base = penalty_table(self.penalty, self.window, self.buffer, log_v, device)
            self._table_key = (log_v, device)
        return self._table, self._base


class ClosestLongestLZLogitsProcessor(LZPenaltyLogitsProcessor):
    """The ``closest_longest`` LZ penalty (the later reference penalizer): not a per-position
    minimum, so subtracted densely (:func:`apply_closest_longest`). Arguments and the matcher as
    :class:`LZPenaltyLogitsProcessor` (the ``codelength`` one), whose transform this one replaces."""

    variant = "closest_longest"

    def apply(self, input_ids, context, lengths, scores):
        tokens, s, valid = self.matcher.match_lengths(context, lengths)
        return apply_closest_longest(scores, tokens, s, valid, self.penalty, self.buffer, self._log_v(scores))


_PROCESSORS = {"codelength": LZPenaltyLogitsProcessor, "closest_longest": ClosestLongestLZLogitsProcessor}
