r"""RPT's common step (:mod:`rpt.sampling.decode.rpt_path`) as a function of the decode state: the eager step,
the compiled one (:mod:`rpt.sampling.decode.compiled_rpt`) and its CUDA-graph replay run this same function.

At column m, for every row the batch-flat path decodes (``state.alive``): write the NTP proposal
``x_m`` (``state.draws[:, 0]``), make the call (``x_m`` -- or sampled k = 1 past the first position,
sweep 1's redraw, which is ``x_m`` once the sweep changes nothing -- and one PTP chain per lag),
propose every token of the call into ``state.pending`` (the block's
:class:`~rpt.sampling.decode.proposal_layout.ProposalLayout`), and set ``state.flags`` (any NaN row, any
event: :func:`~rpt.sampling.decode.step_events.settle_flags`). Where no row has an event the step also
*commits*: ``x_m = final``, the next proposals into ``state.draws``, column ``m + 1`` into
``state.n``. At an event nothing is committed, so a step queued after it (several compiled steps run
between two reads of the flags) repeats the same column and changes nothing: the per-row driver
takes the rows back at column m with the proposals for m and this call's (``hand_over``).

:func:`step_tail` is everything after the model call (``benchmarks/rpt_tail_compile.py`` compiles it
alone, on logits of a real vocabulary, with no model).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rpt.sampling.decode.proposal_layout import ProposalLayout
from rpt.sampling.decode.state import DecodeState
from rpt.sampling.decode.step_events import lag_validity, settle_flags
from rpt.sampling.proposals import call_proposals


def common_ids(seqs: torch.Tensor, pattern, n, guess: torch.Tensor | None) -> torch.Tensor:
    """The common step's tokens: the layout's at each query's source column, and ``guess`` ``[batch]``
    (sampled, k = 1: x_n after an unchanged sweep) at column n, the region's only query (the chains
    keep ``x_n``)."""
    src = pattern.src + n
    if not isinstance(n, int):  # a chain past a short prompt's first column (never read) reads column 0
        src = src.clamp(min=0)
    ids = seqs.index_select(1, src)
    if guess is not None:
        ids[:, 0] = guess
    return ids


def common_iterations(config, lags: tuple[int, ...], batch: int, device: torch.device) -> torch.Tensor | None:
    """``[lags, batch]``: the common step's sweep draws are keyed by iteration 1 (argmax proposals draw
    nothing: None)."""
    if not lags or config.ptp_greedy or config.greedy:
        return None
    return torch.ones((len(lags), batch), dtype=torch.long, device=device)


def redraw(s: DecodeState, m) -> torch.Tensor | None:
    """``[batch]``: what the call feeds at column m in place of ``x_m``: sampled k = 1, sweep 1's redraw
    of ``x_m`` (iteration 1's draw), which is ``x_m`` once the sweep changes nothing; at the first
    position (no sweep) ``x_m`` itself. None when greedy (``x_m`` is fed)."""
    if s.draws.shape[1] == 1:
        return None
    return torch.where(s.prompt < m, s.draws[:, -1], s.draws[:, 0])


def common_step(s: DecodeState, config, m, pattern, contexts, model_call: Callable, out: torch.Tensor) -> None:
    """The common step at column m (an int, or ``s.n`` inside a compiled step), in place on ``s`` and
    ``out`` (the pending-proposals buffer of ``pattern.layout``; module docstring).

    ``contexts``: :class:`~rpt.sampling.decode.contexts.GrowingContexts` or ``RotatedContexts``;
    ``model_call(ids, positions, columns, visibility, offsets, keep)``: the logits of the block's kept
    queries. With an int m the pattern's lags are those that exist at m (``1 .. min(w - 1, m - W)``);
    with the state's ``n`` they are the whole window's at every column, those reaching into the prompt
    computed and ignored (:func:`~rpt.sampling.decode.step_events.lag_validity`)."""
    s.write_column(m, torch.where(s.alive, s.draws[:, 0], s.column(m)))
    ids = common_ids(s.seqs, pattern, m, redraw(s, m))
    positions, write, vis, offsets = s.query_inputs(pattern, ids, m)
    logits = model_call(ids, positions, write, vis, offsets, pattern.keep)
    step_tail(s, config, m, pattern.layout, contexts, logits, ids[:, 0], out)


def step_tail(s: DecodeState, config, m, layout: ProposalLayout, contexts, logits: torch.Tensor, fed: torch.Tensor,
              out: torch.Tensor) -> None:
    """The common step after its model call: the call's proposals from ``logits`` ``[batch, K, V]``
    into ``out``, the flags, and the commit where no live row has an event. ``fed``: ``[batch]``, the
    token the call fed at column m."""
    valid = lag_validity(s, m, layout.lags)
    its = common_iterations(config, layout.lags, fed.shape[0], fed.device)
    props = call_proposals(contexts, logits, m, m - s.pads, fed, layout, its, valid)
    out.copy_(props.packed(layout))
    go = ~settle_flags(s, props, layout.lags, fed, m, valid)  # no live row has an event: the step commits
    if s.draws.shape[1] > 1:  # sampled: x_m is the redraw the call fed
        s.write_column(m, torch.where(s.alive & go, fed, s.column(m)))
    if layout.keep_top:
        s.draws.copy_(torch.where(go, props.top, s.draws))
    s.n.add_(go.long())
