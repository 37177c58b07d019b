r"""The compiled common step of batch-flat RPT (``generate(compile=True)``, :mod:`rpt.sampling.rpt_path`):
the model call, every proposal (NTP and the PTP sweep, with their processors) and the event check
in one ``torch.compile`` region over fixed shapes.

Eagerly, the step's model call is compiled (:class:`~rpt.queries.ModelQueries`) but its proposals run
on contexts ``seqs[:, : c + 1]`` whose width grows every step, a run of small operations per
processor per lag. Here, as in :mod:`rpt.sampling.compiled_ntp`, the layout ``seqs`` is
``[batch, capacity]``, the step's column m a 0-dim tensor, and the processors read the layout
rotated (:class:`~rpt.sampling.contexts.RotatedContexts`), so a decode runs one graph per window
shape: the lags ``1 .. min(w - 1, m - W)`` are a Python tuple the graph specialises on (at most
w - 2 graphs, as the first step runs eagerly; the last one serves every step once the window is
full). The query block and its inputs (``Decoder.common_block`` / ``common_ids`` /
``query_inputs``), the proposals (:func:`~rpt.sampling.proposals.block_proposals`) and the flags
(:func:`rpt.sampling.step_events.step_flags`) are the statements the eager step runs; ``fullgraph=True``
makes any graph break (a host synchronisation, an untraceable processor) an error. The step's one
device-to-host transfer (any NaN row, any event) stays with the caller.

It covers the steps ``W < m < last``: the first position (no window, and a host check whether any
row goes on) and the last column (no NTP proposal to keep) run eagerly, once per decode.
"""

from __future__ import annotations

import torch

from rpt.sampling.contexts import RotatedContexts
from rpt.sampling.proposals import block_proposals
from rpt.sampling.step_events import step_flags


class CompiledRPTStep:
    """``step(m, final, alive)`` at column m (``W < m < last``): feed every row's ``x_m`` (``final`` in its
    place where given: sampled, the redraw after an unchanged sweep) and one PTP chain per lag, propose.

    Returns ``(block, layout, vals, flags)``: the call's block, its proposals in the eager step's
    :class:`~rpt.sampling.proposal_layout.ProposalLayout` (so an event hands the call to the per-row
    driver unchanged), and
    :func:`~rpt.sampling.step_events.step_flags`.
    """

    def __init__(self, d, backend: str):
        self.d = d
        if d.seqs.shape[1] != d.queries.capacity:
            raise AssertionError("the compiled RPT step needs the layout as wide as the cache")
        self.m = torch.full((), d.W, dtype=torch.long, device=d.device)
        self.prompt = torch.full_like(d.pads, d.W)  # a tensor: an int W would be a graph per prompt width
        self._compiled = torch.compile(self._step, dynamic=False, fullgraph=True, backend=backend)
        self._warm = False

    def _step(self, seqs, m, final, alive, pattern, lags: tuple[int, ...]):
        d = self.d
        ids = d.common_ids(seqs, pattern, m, final)
        positions, write, vis, offsets = d.query_inputs(pattern, ids, m)
        logits = d.queries.whole_cache_step(ids, positions, write, vis, offsets, pattern.keep)
        contexts = RotatedContexts(d.config, d.proposer.seeds, seqs, self.prompt, d.pads)
        its = d.common_iterations(lags, ids.shape[0])
        vals = block_proposals(contexts, logits, m, m - d.pads, ids[:, 0], pattern.layout, its)
        return vals, step_flags(d, seqs, vals, pattern.layout, ids[:, 0], alive, m)

    def __call__(self, m: int, final: torch.Tensor | None, alive: torch.Tensor):
        d = self.d
        block = d.common_block(m)
        self.m.fill_(m)  # the step's column as a tensor: one graph for every step of a window shape
        # the first step runs eagerly: the processors fill their module-level caches (the LZ cost
        # tables) on first use, and a cache filled while tracing changes a global that dynamo guards
        # on, so the next call would re-trace
        run = self._compiled if self._warm else self._step
        self._warm = True
        pattern = d.pattern(block)
        with d.queries.whole_cache_calls():
            vals, flags = run(d.seqs, self.m, final, alive, pattern, block.lags)
        return block, pattern.layout, vals, flags
