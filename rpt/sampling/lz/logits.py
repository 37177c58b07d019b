r"""The LZ penalty applied to logits in place, without the ``[batch, V]`` penalty: the ``codelength``
variant as one scatter-min of ``logit - penalty_j`` over the <= W window positions
(:func:`apply_codelength`, reading the flat :func:`penalty_table`), the ``closest_longest`` variant
densely (:func:`apply_closest_longest`). The processors (:mod:`rpt.sampling.lz.processor`) and the
vLLM state (:mod:`rpt.integrations.lz_rows`, :mod:`rpt.integrations.lz_slots`) share them.
"""

from __future__ import annotations

import torch

from rpt.sampling.lz.definition import closest_longest_costs, cost_table


def penalty_table(alpha: float, window: int, buffer: int, log_v: float,
                  device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """``alpha * max(log2 V - cost, 0)`` of :func:`~rpt.sampling.lz.definition.cost_table` flattened, and
    ``B * W + c`` (int32) for each full-window column c: entry ``base[W - m + j] - W * depth`` is
    column j's."""
    cost = cost_table(window, buffer, device)
    table = (log_v - cost).clamp_(min=0.0).mul_(alpha).reshape(-1)
    return table, torch.arange(window, dtype=torch.int32, device=device) + buffer * window


def apply_codelength(scores: torch.Tensor, tokens: torch.Tensor, depth: torch.Tensor, table: torch.Tensor,
                     base: torch.Tensor, window: int, rows: torch.Tensor | None = None) -> torch.Tensor:
    """``scores[v] -= max_j pen_j`` over the window columns j holding v (the ``codelength`` variant),
    in place. ``tokens [n, m]`` right-aligned (-1 gaps), ``depth = B - s``
    (:func:`~rpt.sampling.lz.definition.mismatch_depth`), ``table, base`` from :func:`penalty_table`.
    ``rows [n]``: the rows of ``scores`` (contiguous) that the n windows belong to (default: all, in
    order); the other rows are not read or written."""
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
    (:func:`~rpt.sampling.lz.definition.closest_longest_costs`; not a per-position minimum, so dense), in place;
    ``rows`` as :func:`apply_codelength`."""
    width = scores.shape[-1]
    pen = (log_v - closest_longest_costs(tokens, s, valid, buffer, width, log_v)).mul_(alpha).to(scores.dtype)
    if rows is None:
        return scores.sub_(pen)
    return scores.index_add_(0, rows, pen, alpha=-1)
