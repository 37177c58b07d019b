r"""RPT's common step (:mod:`rpt.sampling.rpt_path`) as a function of the decode state: the eager step,
the compiled one (:mod:`rpt.sampling.compiled_rpt`) and its CUDA-graph replay run this same function.

At column m, for every row the batch-flat path decodes (``state.alive``): write the NTP proposal
``x_m`` (``state.draws[:, 0]``), make the call (``x_m`` -- or ``final``, sampled k = 1: sweep 1's
redraw, which is ``x_m`` once the sweep changes nothing -- and one PTP chain per lag), propose every
token of the call into ``state.pending`` (the block's :class:`~rpt.sampling.proposal_layout.ProposalLayout`),
and set ``state.flags`` (any NaN row, any event: :func:`~rpt.sampling.step_events.step_flags`).
Where no row has an event the step also *commits*: ``x_m = final``, the next proposals into
``state.draws``, column ``m + 1`` into ``state.n``. At an event nothing is committed: the per-row
driver takes the rows back at column m with the proposals for m and this call's (``hand_over``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rpt.sampling.decode_state import DecodeState
from rpt.sampling.proposal_layout import ProposalLayout
from rpt.sampling.proposals import block_proposals
from rpt.sampling.step_events import step_flags


def common_ids(seqs: torch.Tensor, pattern, n, guess: torch.Tensor | None) -> torch.Tensor:
    """The common step's tokens: the layout's at each query's source column, and ``guess`` ``[batch]``
    (sampled, k = 1: x_n after an unchanged sweep) at column n, the region's only query (the chains
    keep ``x_n``)."""
    ids = seqs.index_select(1, pattern.src + n)
    if guess is not None:
        ids[:, 0] = guess
    return ids


def common_iterations(config, lags: tuple[int, ...], batch: int, device: torch.device) -> torch.Tensor | None:
    """``[lags, batch]``: the common step's sweep draws are keyed by iteration 1 (argmax proposals draw
    nothing: None)."""
    if not lags or config.ptp_greedy or config.greedy:
        return None
    return torch.ones((len(lags), batch), dtype=torch.long, device=device)


def common_step(s: DecodeState, config, m, pattern, lags: tuple[int, ...], final_draw: bool, contexts,
                model_call: Callable, out: torch.Tensor) -> None:
    """The common step at column m (an int, or ``s.n`` inside a compiled step), in place on ``s`` and
    ``out`` (the pending-proposals buffer of ``pattern.layout``; module docstring).

    ``final_draw``: x_m is redrawn after the sweep (sampled, past the first position); ``contexts``:
    :class:`~rpt.sampling.contexts.GrowingContexts` or ``RotatedContexts``; ``model_call(ids, positions,
    columns, visibility, offsets, keep)``: the logits of the block's kept queries."""
    layout: ProposalLayout = pattern.layout
    s.write_column(m, torch.where(s.alive, s.draws[:, 0], s.column(m)))
    final = s.draws[:, -1] if final_draw else None
    ids = common_ids(s.seqs, pattern, m, final)
    positions, write, vis, offsets = s.query_inputs(pattern, ids, m)
    logits = model_call(ids, positions, write, vis, offsets, pattern.keep)
    its = common_iterations(config, lags, ids.shape[0], ids.device)
    vals = block_proposals(contexts, logits, m, m - s.pads, ids[:, 0], layout, its)
    out.copy_(vals)
    s.flags.copy_(step_flags(s, s.seqs, vals, layout, ids[:, 0], s.alive, m))
    go = ~s.flags[1]  # no live row has an event: the step is committed
    if final is not None:
        s.write_column(m, torch.where(s.alive & go, final, s.column(m)))
    if layout.keep_top:
        s.draws.copy_(torch.where(go, vals[:, layout.top], s.draws))
    s.n.add_(go.long())
