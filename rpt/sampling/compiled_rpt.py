r"""The compiled common step of batch-flat RPT (``generate(compile=True)``, :mod:`rpt.sampling.rpt_path`):
the model call, every proposal (NTP and the PTP sweep, with their processors) and the event check
in one ``torch.compile`` region over fixed shapes.

Eagerly, the step's model call is compiled (:class:`~rpt.queries.ModelQueries`) but its proposals run
on contexts ``seqs[:, : c + 1]`` whose width grows every step, a run of small operations per
processor per lag. Here, as in :mod:`rpt.sampling.compiled_ntp`, the layout ``seqs`` is
``[batch, capacity]``, the step's column m a 0-dim tensor, and the processors read the layout
rotated (:class:`~rpt.sampling.contexts.RotatedContexts`), so a decode runs one graph per window
shape: the lags ``1 .. min(w - 1, m - W)`` are a Python tuple the graph specialises on (at most
w - 2 graphs, as the first step runs eagerly; the last one serves every step once the window is full). The query block, the proposals
(:func:`~rpt.sampling.proposals.block_proposals`) and the events
(:func:`rpt.sampling.rpt_path.events`) are the statements the eager step runs; ``fullgraph=True``
makes any graph break (a host synchronisation, an untraceable processor) an error. The step's one
device-to-host transfer (any NaN row, any event) stays with the caller.

It covers the steps ``W < m < last``: the first position (no window, and a host check whether any
row goes on) and the last column (no NTP proposal to keep) run eagerly, once per decode.
"""

from __future__ import annotations

import torch

from rpt.queries import COMPILED_GRAPHS, Visibility, attention_implementation
from rpt.sampling.contexts import RotatedContexts
from rpt.sampling.proposals import block_proposals


def step_block(d, m: int):
    """The query block of the common step at column m (:meth:`_Decoder.call_block`'s, for m < last)."""
    from rpt.sampling.fast_decoder import _Block  # the decoder imports this module

    return _Block(1, tuple(range(1, min(d.plan.w - 1, m - d.W) + 1)), keep_top=True, keep_prev=False)


class CompiledRPTStep:
    """``step(m, final, alive)`` at column m (``W < m < last``): feed every row's ``x_m`` (``final`` in its
    place where given: sampled, the redraw after an unchanged sweep) and one PTP chain per lag, propose.

    Returns ``(block, vals, flags)``: the call's block, its proposals as the eager step lays them out
    (so an event hands the call to the per-row driver unchanged), ``flags`` ``[2]`` = (any live row's
    logits NaN / inf, any live row's event).
    """

    def __init__(self, d, backend: str):
        self.d, q = d, d.queries
        if d.seqs.shape[1] != q.capacity:
            raise AssertionError("the compiled RPT step needs the layout as wide as the cache")
        self.m = torch.full((), d.W, dtype=torch.long, device=d.device)
        self.prompt = torch.full_like(d.pads, d.W)  # a tensor: an int W would be a graph per prompt width
        self.its_greedy = d.proposer.ptp_samples_greedy
        self._compiled = torch.compile(self._step, dynamic=False, fullgraph=True, backend=backend)
        self._warm = False

    def _step(self, seqs, m, final, alive, pattern: tuple, lags: tuple[int, ...]):
        from rpt.sampling.rpt_path import events  # rpt_path imports this module

        d, q = self.d, self.d.queries
        src, write, limit, since, offsets, keep = pattern  # the block's tensors (_Pattern), relative to m
        src, write = src + m, write + m
        ids = seqs.index_select(1, src)
        if final is not None:  # column m is the region's only query, the first
            ids = torch.cat([final[:, None], ids[:, 1:]], 1)
        positions = (src[None] - d.pads[:, None]).clamp(min=0)
        mask = q.mask(Visibility(limit + m, d.start_cols, since + m), write, q.capacity)
        logits = q._step(ids, positions, offsets.expand_as(ids), mask, write, keep)
        batch = ids.shape[0]
        its = None if self.its_greedy else torch.ones((len(lags), batch), dtype=torch.long, device=ids.device)
        contexts = RotatedContexts(d.config, d.proposer.seeds, seqs, self.prompt, d.pads)
        vals = block_proposals(contexts, logits, m, m - d.pads, ids[:, 0], True, False, lags, its)
        x_m = ids[:, 0]  # x_m as it stands if the sweep changes nothing
        ends = (d.last_cols <= m) | torch.isin(x_m, d.eos)
        event = events(seqs, vals, lags, d.proposer.ntp_draws, m) | ends
        return vals, torch.stack([(vals[:, 0].bool() & alive).any(), (event & alive).any()])

    def __call__(self, m: int, final: torch.Tensor | None, alive: torch.Tensor):
        d, q = self.d, self.d.queries
        block = step_block(d, m)
        p = d._pattern(block)
        self.m.fill_(m)  # the step's column as a tensor: one graph for every step of a window shape
        q.calls += 1
        q.cache.kv_len = q.capacity
        # the first step runs eagerly: the processors fill their module-level caches (the LZ cost
        # tables) on first use, and a cache filled while tracing changes a global that dynamo guards
        # on, so the next call would re-trace
        run = self._compiled if self._warm else self._step
        self._warm = True
        with attention_implementation(q.model, q.switch), torch._dynamo.config.patch(recompile_limit=COMPILED_GRAPHS):
            vals, flags = run(d.seqs, self.m, final, alive, (p.src, p.write, p.limit, p.since, p.offsets, p.keep),
                              block.lags)
        return block, vals, flags
