r"""The compiled common step of batch-flat RPT (``generate(compile=True)``, :mod:`rpt.sampling.decode.rpt_path`):
:func:`~rpt.sampling.decode.rpt_step.common_step` -- the model call, every proposal (NTP and the PTP
sweep, with their processors), the event check and the commit -- in one ``torch.compile`` region
over fixed shapes (on CUDA with inductor, replayed from a CUDA graph: :mod:`rpt.sampling.decode.compile_mode`).

Eagerly, the step's proposals run on contexts ``seqs[:, : c + 1]`` whose width grows every step and
on the lags that exist at the column (``1 .. min(w - 1, m - W)``). Here, as in
:mod:`rpt.sampling.decode.compiled_ntp`, the state's layout is ``[batch, capacity]``, the step's column the
state's 0-dim ``n`` (advanced by the step itself), the processors read the layout rotated
(:class:`~rpt.sampling.decode.contexts.RotatedContexts`), and the call carries every lag of the window at
every column (a chain reaching into the prompt is computed and ignored), so a decode runs **one
graph**, the same from its first position ``W`` to its last column, for every prompt width of its
capacity bucket, padded or not. Every input it reads is a static buffer (the state, the KV cache,
the block pattern's tensors), so the graph replays without copies, and several steps run between
two reads of the flags (:func:`rpt.sampling.decode.compile_mode.steps_per_read`).
"""

from __future__ import annotations

import torch

from rpt.sampling.decode.compile_mode import compile_step
from rpt.sampling.decode.contexts import RotatedContexts
from rpt.sampling.decode.rpt_step import common_iterations, common_step
from rpt.sampling.decode.state import DecodeState
from rpt.sampling.decode.step_events import lag_validity
from rpt.sampling.processors import caches_at_first_use
from rpt.sampling.proposals import call_proposals


def _fixed_step(s: DecodeState, config, queries, pattern, out: torch.Tensor) -> None:
    """:func:`common_step` at the state's column on fixed shapes: the whole cache, rotated contexts."""
    contexts = RotatedContexts(config, s.seeds, s.seqs, s.prompt, s.pads, s.knobs)  # the knobs' values: tensors
    common_step(s, config, s.n, pattern, contexts, queries.whole_cache_step, out)


class CompiledRPTStep:
    """``step(state, config, queries, pattern)``: :func:`_fixed_step` compiled. Owned by the pooled
    :class:`~rpt.sampling.decode.buffers.DecodeBuffers` whose state and queries it is called with."""

    def __init__(self, backend, device: torch.device):
        self._compiled = compile_step(_fixed_step, backend, device)

    @staticmethod
    def warm(s: DecodeState, config, pattern, vocab: int, dtype: torch.dtype) -> None:
        """The step's proposals once, eagerly, on zero logits ``[batch, K, vocab]`` (results unused), when
        a processor fills a module-level cache at first use (the LZ cost tables): a cache filled while
        tracing changes a global that dynamo guards, so the next call would re-trace. Nothing to do
        otherwise: the decode's first step is compiled like every other (no eager model call)."""
        if not caches_at_first_use(config):
            return
        layout = pattern.layout
        batch = s.seqs.shape[0]
        logits = torch.zeros(batch, len(layout.lags) + layout.keep_top + layout.keep_prev, vocab, dtype=dtype,
                             device=s.seqs.device)
        contexts = RotatedContexts(config, s.seeds, s.seqs, s.prompt, s.pads)
        call_proposals(contexts, logits, s.n, s.n - s.pads, s.column(s.n), layout,
                       common_iterations(config, layout.lags, batch, s.seqs.device), lag_validity(s, s.n, layout.lags))

    def __call__(self, s: DecodeState, traced, queries, pattern) -> None:
        """One step; ``traced``: the decode's :meth:`~rpt.sampling.config.SamplingConfig.traced` config (the
        values of its float knobs in ``s.knobs``: one graph for every confidence, temperature, penalty)."""
        out = s.pending_for(pattern.layout)  # allocated outside the graph, at its first use
        with queries.whole_cache_calls():
            self._compiled(s, traced, queries, pattern, out)
