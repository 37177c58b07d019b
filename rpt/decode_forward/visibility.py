r"""What a query of a decode call may attend to (eq. 4's masks), stated once as a predicate.

A :class:`Visibility` gives each query two column ranges of the position-addressed cache
(:class:`~rpt.decode_forward.kv_cache.PositionKVCache`):

* the **sequence** columns ``start[b] .. limit[b, q]`` (a row's left padding lies before ``start``; an
  NTP query at column c has ``limit = c``, a PTP chain predicting ``x_j`` has ``limit = j - 1``: it must
  not see the token it may replace);
* the columns ``since[q] .. columns[q]``: its own (so no query ever has an empty softmax row) and, for a
  PTP chain written in consecutive scratch columns past the end of the sequence, the chain's earlier
  tokens.

:func:`visible` is that rule on index tensors; the same function builds the boolean mask of an eager call
(:func:`visibility_mask`, broadcast index grids) and is flex attention's ``score_mod`` inside a compiled
one (:mod:`rpt.decode_forward.llama_forward`, scalar indices), so the two kernels cannot disagree on what a query sees.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Visibility:
    """What each query of a call may attend to: two column ranges (see the module docstring).

    ``limit``: ``[Q]`` or ``[batch, Q]`` (or ``[1, Q]``) last visible sequence column per query; ``start``: ``[batch]``
    first one per row (None: 0). ``since``: ``[Q]`` first column of the query's own run in this call (a
    PTP chain's first token; None: only its own column), visible up to the query's own column.
    """

    limit: torch.Tensor
    start: torch.Tensor | None = None
    since: torch.Tensor | None = None


def visible(vis: Visibility, columns: torch.Tensor, b, q, key) -> torch.Tensor:
    """Whether query ``q`` of row ``b`` may attend to cache column ``key``: index tensors that broadcast
    together (0-dim ones inside flex attention's ``score_mod``); ``columns``: ``[Q]`` the queries' own. A
    2-D ``limit`` has a row per batch row here."""
    limit = vis.limit[b, q] if vis.limit.dim() == 2 else vis.limit[q]
    allowed = key <= limit
    if vis.start is not None:
        allowed = allowed & (key >= vis.start[b])
    own = columns[q]
    since = own if vis.since is None else vis.since[q]
    return allowed | ((key >= since) & (key <= own))


def visibility_mask(vis: Visibility, columns: torch.Tensor, kv_len: int) -> torch.Tensor:
    """``[batch or 1, Q, kv_len]`` bool: True where a query may attend to a cache column."""
    if vis.limit.dim() == 2 and vis.limit.shape[0] == 1:  # one row of limits for every row
        vis = Visibility(vis.limit[0], vis.start, vis.since)
    rows = vis.limit.shape[0] if vis.limit.dim() == 2 else (1 if vis.start is None else vis.start.shape[0])
    device = columns.device
    b = torch.arange(rows, device=device)[:, None, None]
    q = torch.arange(columns.shape[0], device=device)[None, :, None]
    return visible(vis, columns, b, q, torch.arange(kv_len, device=device))
