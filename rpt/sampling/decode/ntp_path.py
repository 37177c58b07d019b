r"""``NTPPath``: the batch-flat decode of plain NTP (``rpt_iters == 0``), host work that does not grow
with the batch, and its step compiled (``generate(compile=True)``).

The per-row driver (:mod:`rpt.sampling.decode.driver`) resumes every row's program
(:func:`rpt.sampling.algorithm.decode_row`) each step, tens of microseconds of Python per row. For
plain NTP sampling the program is one proposal per position and a stop check, so here the decode
state of all rows lives in device tensors (tokens, each row's last column, which rows are done)
and a step is a fixed run of tensor operations around one model call: propose (the same
:class:`~rpt.sampling.proposals.Proposer`, the same position-keyed draws), write the token, mark
rows that produced an EOS or reached their budget, all written into the decode state in place
(:class:`~rpt.sampling.decode.state.DecodeState`), and one device-to-host transfer (NaN logits and
whether every row is done) per step -- per several compiled steps on CUDA
(:func:`~rpt.sampling.decode.compile_mode.steps_per_read`). A
finished row is fed its pad id until the others finish, as in Hugging Face ``generate``.

It covers what needs no per-row Python: no stop strings (they decode text), no token healing
(a per-row frontier), no streamer. The per-row driver runs everything else, and this path is tested
against :func:`~rpt.sampling.reference.generate_reference` as that one is.

**The compiled step** (:func:`ntp_step`, :class:`CompiledNTPStep`): the model call, the logits processors,
the proposal and the stop bookkeeping in one ``torch.compile`` region over fixed shapes. Eagerly the
processors get the context ``seqs[:, : n + 1]``, whose width grows every step: under compile a new
shape, so a new graph, each step. Compiled, every input has a shape fixed for every decode of the same
capacity bucket, and the same storage (the state pooled by :mod:`rpt.sampling.decode.buffers`):

* the layout ``seqs`` is ``[batch, capacity]`` (the cache's bucketed capacity, pad ids past the
  end), and the step's column ``n`` is a 0-dim tensor the step advances itself, not a Python int
  (dynamo would specialise on an int and compile a graph per step);
* the processors read the layout *rotated* so that column n is the last one
  (:class:`~rpt.sampling.decode.contexts.RotatedContexts`): one shape at every step.

The step writes its token, the rows' done / end and the flags into the state and returns nothing, so
the host may run several steps between two reads of the flags (finished rows are fed their pad id on
the device). The :class:`~rpt.sampling.proposals.Proposer` is rebuilt inside the compiled function for
the tensor-valued conventions: dynamo runs its constructors once, while tracing, and the graph holds
only the tensor operations.
"""

from __future__ import annotations

import torch

from rpt.decode_forward.queries import ModelQueries, Visibility
from rpt.sampling.config import SamplingConfig
from rpt.sampling.decode.compile_mode import STEPS_PER_TRANSFER, compile_step, steps_per_read  # noqa: F401 -- the table, also here
from rpt.sampling.decode.contexts import RotatedContexts
from rpt.sampling.decode.inputs import DecodeInputs
from rpt.sampling.decode.query_block import Block, Pattern
from rpt.sampling.decode.state import DecodeState
from rpt.sampling.decode.step_context import StepContext
from rpt.sampling.processors import caches_at_first_use
from rpt.sampling.proposals import nonfinite, raise_nonfinite


def eligible(inputs: DecodeInputs, streamer) -> bool:
    """Whether the decode of ``inputs`` is plain NTP with nothing that needs per-row Python."""
    return (inputs.plan.k == 0 and not inputs.config.stop and not any(inputs.prompts.prefixes)
            and streamer is None)


class NTPPath:
    """Every row of one decode, decoded to its end as tensors (module docstring)."""

    def __init__(self, context: StepContext):
        self.context = context

    def run(self) -> tuple[list[list[int]], list[str]]:
        """The rows' generated tokens and finish reasons (``"eos"`` or ``"length"``)."""
        c = self.context
        s, W = c.state, c.width
        n = W - 1
        # the prefill (the prompts' columns) and its proposals run eagerly; with compile, every later step
        # (model call, processors, proposal) is one compiled function over fixed shapes
        logits = c.logits(*self._block(W, n), n)[:, 0]
        step = self._compiled(logits)
        self._eager_step(logits, n)
        n += 1
        s.n.fill_(n)
        per_read = steps_per_read(c.device) if step is not None else 1
        while True:
            error, finished = s.flags.tolist()  # the one transfer of the steps since the last
            if error:
                raise_nonfinite(s.bad.nonzero()[:, 0].tolist())
            if finished:
                break
            if step is None:
                self._eager_step(c.logits(*self._block(1, n), n)[:, 0], n)
                n += 1
                continue
            steps = min(per_read, c.last - n)  # never past the last column a row may write
            for _ in range(steps):
                step(s, c.traced, c.queries)
            n += steps
        counts = (s.end[: s.rows] - W + 1).tolist()  # the decode's rows (a batch bucket's inert ones aside)
        rows = s.seqs[: s.rows, W: W + max(counts)].tolist()
        generated = [row[:k] for row, k in zip(rows, counts)]
        eos_ids = set(c.config.eos_token_ids)
        return generated, ["eos" if g and g[-1] in eos_ids else "length" for g in generated]

    def _block(self, region: int, n: int) -> tuple[Block, Pattern, torch.Tensor]:
        """The eager call at column n feeding the rows' columns ``n - region + 1 .. n`` as NTP queries:
        its block, pattern and tokens."""
        block = Block(region, (), keep_top=True, keep_prev=False)
        # a copy, not a view: a view's strides follow the layout's width, and compile guards on strides
        ids = self.context.state.seqs[:, n - region + 1: n + 1].clone(memory_format=torch.contiguous_format)
        return block, self.context.pattern(block), ids

    def _eager_step(self, logits: torch.Tensor, n: int) -> None:
        """Propose every row's token for column n + 1 from its logits ``[batch, V]`` at n, into the state
        (as the compiled step does, on the growing context ``seqs[:, : n + 1]``)."""
        s = self.context.state
        s.bad |= nonfinite(logits) & ~s.done  # a finished row's logits (of its pad id) are never used
        token = self.context.proposer.ntp(s.seqs[:, : n + 1], logits, n + 1 - s.pads)[:, 0]
        settle(s, token, n)

    def _compiled(self, prefill: torch.Tensor) -> CompiledNTPStep | None:
        """The compiled step (None: an eager decode), built once per pooled buffers and warmed once per
        decode on the prefill's logits ``[batch, V]`` (:meth:`CompiledNTPStep.warm`)."""
        c = self.context
        if c.compile_backend is None:
            return None
        step = c.steps.get("ntp")
        if step is None:
            step = c.steps["ntp"] = CompiledNTPStep(c.compile_backend, c.device)
        step.warm(c.state, c.config, prefill)
        return step


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


def propose_fixed(config: SamplingConfig, seeds: torch.Tensor, seqs: torch.Tensor, logits: torch.Tensor,
                  n: torch.Tensor, prompt: torch.Tensor, pads: torch.Tensor,
                  knobs: torch.Tensor | None = None) -> torch.Tensor:
    """``[batch, draws]``: what ``Proposer(config, W, seeds, pad_length=pads).ntp(seqs[:, : n + 1], logits,
    n + 1 - pads)`` proposes, read from the whole fixed-width layout ``seqs`` with ``n`` a 0-dim tensor
    (:class:`~rpt.sampling.decode.contexts.RotatedContexts`): the same shapes at every step. ``prompt``:
    ``[batch]`` all W (a tensor, so that the graph does not depend on the prompt width); ``knobs``: the
    float knobs as a tensor (``config`` then the traced one, :meth:`~rpt.sampling.config.SamplingConfig.traced`)."""
    proposer, context = RotatedContexts(config, seeds, seqs, prompt, pads, knobs).upto(n)
    return proposer.ntp(context, logits, n + 1 - pads)


def ntp_step(s: DecodeState, config: SamplingConfig, queries: ModelQueries) -> None:
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
    def warm(s: DecodeState, config: SamplingConfig, logits: torch.Tensor) -> None:
        """One eager proposal (on a copy of the prefill's logits ``[batch, V]``, result unused), once per
        decode, where a processor fills a module-level cache on first use (the LZ cost tables): a cache
        filled while tracing changes a global that dynamo guards, so the next call would re-trace."""
        if caches_at_first_use(config):
            propose_fixed(config, s.seeds, s.seqs, logits.clone(), s.n, s.prompt, s.pads)

    def __call__(self, s: DecodeState, traced: SamplingConfig, queries: ModelQueries) -> None:
        """One step; ``traced``: the decode's :meth:`~rpt.sampling.config.SamplingConfig.traced` config."""
        with queries.whole_cache_calls():
            self._compiled(s, traced, queries)
