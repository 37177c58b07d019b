r"""The compiled step of the batch-flat NTP path (``generate(compile=True)``, ``rpt_iters == 0``): the model
call, the logits processors and the proposal in one ``torch.compile`` region over fixed shapes.

Eagerly, :mod:`rpt.sampling.ntp_path` hands the processors the context ``seqs[:, : n + 1]``, whose
width grows every step: under compile a new shape, so a new graph, each step. Here every input has a
shape fixed for the whole decode (for every decode of the same capacity bucket):

* the layout ``seqs`` is ``[batch, capacity]`` (the cache's bucketed capacity, pad ids past the
  end), and the step's column ``n`` is a 0-dim tensor, not a Python int (dynamo would specialise on
  an int and compile a graph per step);
* the processors read the layout *rotated* so that column n is the last one
  (:class:`~rpt.sampling.contexts.RotatedContexts`): one shape at every step.

The :class:`~rpt.sampling.proposals.Proposer` is rebuilt inside the compiled function for these
tensor-valued conventions: dynamo runs its constructors once, while tracing, and the graph holds only
the tensor operations. ``fullgraph=True`` makes any graph break (a host synchronisation such as
``.item()``, or an untraceable processor) an error rather than a silent split of the step. The
path's one device-to-host transfer per step (NaN rows and whether every row is done) stays outside.
"""

from __future__ import annotations

import torch

from rpt.queries import Visibility
from rpt.sampling.contexts import RotatedContexts
from rpt.sampling.proposals import nonfinite


def settle(d, token: torch.Tensor, n, done: torch.Tensor, end: torch.Tensor):
    """The token each row writes at column ``n + 1`` (a finished row's pad id), the rows done after it,
    and each row's final column: the bookkeeping of one NTP step, shared by the eager and the compiled
    step."""
    token = torch.where(done, d.pad_id, token)
    stop = ~done & d.ends_at(token, n + 1)
    return token, done | stop, torch.where(stop, n + 1, end)


def propose_fixed(config, seeds: torch.Tensor, seqs: torch.Tensor, logits: torch.Tensor, n: torch.Tensor,
                  prompt: torch.Tensor, pads: torch.Tensor) -> torch.Tensor:
    """``[batch, draws]``: what ``Proposer(config, W, seeds, pad_length=pads).ntp(seqs[:, : n + 1], logits,
    n + 1 - pads)`` proposes, read from the whole fixed-width layout ``seqs`` with ``n`` a 0-dim tensor
    (:class:`~rpt.sampling.contexts.RotatedContexts`): the same shapes at every step. ``prompt``:
    ``[batch]`` all W (a tensor, so that the graph does not depend on the prompt width)."""
    proposer, context = RotatedContexts(config, seeds, seqs, prompt, pads).upto(n)
    return proposer.ntp(context, logits, n + 1 - pads)


class CompiledNTPStep:
    """``step(n, done, end)``: feed every row's token at column n, propose its token for n + 1.

    Returns ``(token, done, end, bad, flags)``: ``bad`` the rows whose logits were NaN / inf (finished
    rows aside), ``flags`` ``[2]`` = (any bad, all done), for the caller's one transfer.
    """

    def __init__(self, d, backend: str, logits: torch.Tensor):
        self.d, q = d, d.queries
        if d.seqs.shape[1] != q.capacity:
            raise AssertionError("the compiled NTP step needs the layout as wide as the cache")
        self.n = torch.full((), d.W - 1, dtype=torch.long, device=d.device)
        self.prompt = torch.full_like(d.pads, d.W)  # a tensor: an int W would be a graph per prompt width
        # One eager proposal (on a copy of the prefill's logits ``[batch, V]``, result unused): the
        # processors fill their module-level caches (the LZ cost tables) on first use, and a cache
        # filled while tracing changes a global that dynamo guards, so the next call would re-trace.
        propose_fixed(d.config, d.proposer.seeds, d.seqs, logits.clone(), self.n, self.prompt, d.pads)
        self._compiled = torch.compile(self._step, dynamic=False, fullgraph=True, backend=backend)

    def _step(self, seqs, n, done, end):
        d, q = self.d, self.d.queries
        column = n.view(1)
        positions = (n - d.pads).clamp(min=0)[:, None]  # each row's position of column n
        logits = q.whole_cache_step(seqs.index_select(1, column), positions, column,
                                    Visibility(column, d.start_cols, column))[:, 0]
        bad = nonfinite(logits) & ~done
        token = propose_fixed(d.config, d.proposer.seeds, seqs, logits, n, self.prompt, d.pads)[:, 0]
        token, done, end = settle(d, token, n, done, end)
        return token, done, end, bad, torch.stack([bad.any(), done.all()])

    def __call__(self, n: int, done: torch.Tensor, end: torch.Tensor):
        d = self.d
        self.n.fill_(n)  # the step's column as a tensor: one graph for every step
        with d.queries.whole_cache_calls():
            return self._compiled(d.seqs, self.n, done, end)
