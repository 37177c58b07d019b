r"""The NTP step of the batch-flat path (``rpt_iters == 0``) as a function of the decode state, and its
compiled form (``generate(compile=True)``): the model call, the logits processors, the proposal and
the stop bookkeeping in one ``torch.compile`` region over fixed shapes.

Eagerly, :mod:`rpt.sampling.decode.ntp_path` hands the processors the context ``seqs[:, : n + 1]``, whose
width grows every step: under compile a new shape, so a new graph, each step. Here every input has a
shape fixed for every decode of the same capacity bucket, and the same storage
(:class:`~rpt.sampling.decode.state.DecodeState`, pooled by :mod:`rpt.sampling.decode.buffers`):

* the layout ``seqs`` is ``[batch, capacity]`` (the cache's bucketed capacity, pad ids past the
  end), and the step's column ``n`` is a 0-dim tensor the step advances itself, not a Python int
  (dynamo would specialise on an int and compile a graph per step);
* the processors read the layout *rotated* so that column n is the last one
  (:class:`~rpt.sampling.decode.contexts.RotatedContexts`): one shape at every step.

The step writes its token, the rows' done / end and the flags into the state and returns nothing, so
the host may run several steps between two reads of the flags (:mod:`rpt.sampling.decode.ntp_path`; finished
rows are fed their pad id on the device). The :class:`~rpt.sampling.proposals.Proposer` is rebuilt
inside the compiled function for the tensor-valued conventions: dynamo runs its constructors once,
while tracing, and the graph holds only the tensor operations.
"""

from __future__ import annotations

import torch

from rpt.decode_forward.queries import Visibility
from rpt.sampling.decode.compile_mode import compile_step
from rpt.sampling.decode.contexts import RotatedContexts
from rpt.sampling.decode.state import DecodeState
from rpt.sampling.processors import caches_at_first_use
from rpt.sampling.proposals import nonfinite


def settle(s: DecodeState, token: torch.Tensor, n) -> None:
    """Write each row's token at column ``n + 1`` (a finished row's pad id), mark the rows it ends, and
    set the flags (any NaN row, all done): the bookkeeping of one NTP step, in place, shared by the
    eager and the compiled step. ``n``: an int, or the state's 0-dim column inside a compiled step."""
    token = torch.where(s.done, s.pad_id, token)
    stop = ~s.done & s.ends_at(token, n + 1)
    s.done |= stop
    s.end.copy_(torch.where(stop, n + 1, s.end))
    s.write_column(n + 1, token)
    s.flags.copy_(torch.stack([s.bad.any(), s.done.all()]))


def propose_fixed(config, seeds: torch.Tensor, seqs: torch.Tensor, logits: torch.Tensor, n: torch.Tensor,
                  prompt: torch.Tensor, pads: torch.Tensor, knobs: torch.Tensor | None = None) -> torch.Tensor:
    """``[batch, draws]``: what ``Proposer(config, W, seeds, pad_length=pads).ntp(seqs[:, : n + 1], logits,
    n + 1 - pads)`` proposes, read from the whole fixed-width layout ``seqs`` with ``n`` a 0-dim tensor
    (:class:`~rpt.sampling.decode.contexts.RotatedContexts`): the same shapes at every step. ``prompt``:
    ``[batch]`` all W (a tensor, so that the graph does not depend on the prompt width); ``knobs``: the
    float knobs as a tensor (``config`` then the traced one, :meth:`~rpt.sampling.config.SamplingConfig.traced`)."""
    proposer, context = RotatedContexts(config, seeds, seqs, prompt, pads, knobs).upto(n)
    return proposer.ntp(context, logits, n + 1 - pads)


def ntp_step(s: DecodeState, config, queries) -> None:
    """Feed every row's token at the state's column n, write its token for n + 1, advance n: in place.
    ``config``: the traced config (:meth:`~rpt.sampling.config.SamplingConfig.traced`), the values of its
    float knobs in ``s.knobs``: one graph for every temperature, penalty and threshold."""
    n = s.n
    column = n.view(1)
    # the rows' pads even where none is padded (zeros: the same mask), so that one graph serves both
    positions = (n - s.pads).clamp(min=0)[:, None]  # each row's position of column n
    logits = queries.whole_cache_step(s.seqs.index_select(1, column), positions, column,
                                      Visibility(column, s.pads, column))[:, 0]
    s.bad |= nonfinite(logits) & ~s.done  # a finished row's logits (of its pad id) are never used
    token = propose_fixed(config, s.seeds, s.seqs, logits, n, s.prompt, s.pads, s.knobs)[:, 0]
    settle(s, token, n)
    s.n.add_(1)


class CompiledNTPStep:
    """``step(state, config, queries)``: :func:`ntp_step` compiled (on CUDA with inductor: replayed from a
    CUDA graph, :mod:`rpt.sampling.decode.compile_mode`). Owned by the pooled
    :class:`~rpt.sampling.decode.buffers.DecodeBuffers` whose state and queries it is called with."""

    def __init__(self, backend, device: torch.device):
        self._compiled = compile_step(ntp_step, backend, device)

    @staticmethod
    def warm(s: DecodeState, config, logits: torch.Tensor) -> None:
        """One eager proposal (on a copy of the prefill's logits ``[batch, V]``, result unused), once per
        decode, where a processor fills a module-level cache on first use (the LZ cost tables): a cache
        filled while tracing changes a global that dynamo guards, so the next call would re-trace."""
        if caches_at_first_use(config):
            propose_fixed(config, s.seeds, s.seqs, logits.clone(), s.n, s.prompt, s.pads)

    def __call__(self, s: DecodeState, traced, queries) -> None:
        """One step; ``traced``: the decode's :meth:`~rpt.sampling.config.SamplingConfig.traced` config."""
        with queries.whole_cache_calls():
            self._compiled(s, traced, queries)
