r"""The compiled common step of batch-flat RPT (``generate(compile=True)``, :mod:`rpt.sampling.rpt_path`):
:func:`~rpt.sampling.common_step.common_step` -- the model call, every proposal (NTP and the PTP
sweep, with their processors), the event check and the commit -- in one ``torch.compile`` region
over fixed shapes (on CUDA with inductor, replayed from a CUDA graph: :mod:`rpt.sampling.step_compile`).

Eagerly, the step's model call is compiled (:class:`~rpt.queries.ModelQueries`) but its proposals run
on contexts ``seqs[:, : c + 1]`` whose width grows every step, a run of small operations per
processor per lag. Here, as in :mod:`rpt.sampling.compiled_ntp`, the state's layout is
``[batch, capacity]``, the step's column the state's 0-dim ``n`` (advanced by the step itself), and
the processors read the layout rotated (:class:`~rpt.sampling.contexts.RotatedContexts`), so a decode
runs one graph per window shape: the lags ``1 .. min(w - 1, m - W)`` are a Python tuple the graph
specialises on (at most w - 2 graphs, as the first step runs eagerly; the last one serves every step
once the window is full). The step's one device-to-host transfer (the state's flags) stays with the
caller.

It covers the steps ``W < m < last``: the first position (no window, and a host check whether any
row goes on) and the last column (no NTP proposal to keep) run eagerly, once per decode.
"""

from __future__ import annotations

import torch

from rpt.sampling.common_step import common_step
from rpt.sampling.contexts import RotatedContexts
from rpt.sampling.decode_state import DecodeState
from rpt.sampling.step_compile import compile_step


def _fixed_step(s: DecodeState, config, queries, pattern, lags: tuple[int, ...], final_draw: bool,
                out: torch.Tensor) -> None:
    """:func:`common_step` at the state's column on fixed shapes: the whole cache, rotated contexts."""
    contexts = RotatedContexts(config, s.seeds, s.seqs, s.prompt, s.pads)
    common_step(s, config, s.n, pattern, lags, final_draw, contexts, queries.whole_cache_step, out)


class CompiledRPTStep:
    """``step(state, config, queries, pattern, lags, final_draw, eager)``: :func:`_fixed_step` compiled
    (``eager=True`` runs the same function uncompiled: a decode's first step, so that the processors
    fill their module-level caches -- the LZ cost tables -- outside tracing, where filling them would
    change a global dynamo guards on and the next call would re-trace). Owned by the pooled
    :class:`~rpt.sampling.decode_buffers.DecodeBuffers` whose state and queries it is called with."""

    def __init__(self, backend, device: torch.device):
        self._compiled = compile_step(_fixed_step, backend, device)

    def __call__(self, s: DecodeState, config, queries, pattern, lags: tuple[int, ...], final_draw: bool,
                 eager: bool = False) -> None:
        out = s.pending_for(pattern.layout)  # allocated outside the graph, at its first use
        run = _fixed_step if eager else self._compiled
        with queries.whole_cache_calls():
            run(s, config, queries, pattern, lags, final_draw, out)
