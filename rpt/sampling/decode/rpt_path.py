r"""``RPTPath``: RPT's batch-flat common step (``rpt_iters >= 1``), host work that does not grow with the
batch while nothing happens, and its step compiled (``generate(compile=True)``). Greedy
(``temperature == 0``, any k) and sampled with one iteration (k = 1).

The per-row driver (:mod:`rpt.sampling.decode.driver`) resumes every row's program
(:func:`rpt.sampling.algorithm.decode_row`) at every step: tens of microseconds of Python per row.
The common step is the same for every row. Greedy: the NTP proposal ``x_m`` (known from the
previous call) is appended, the sweep over the window finds no accepted proposal that differs from
the current token, so the iterations end (greedy: a repeat would change nothing), the position
settles without a stop, and the next proposal is the argmax at ``m``. Sampled, k = 1: ``x_m`` is the
iteration-0 draw (known from the previous call, as is the iteration-1 draw: both are keyed draws
from the same logits); the sweep's PTP draws (keyed by iteration 1) are rejected or equal the
current tokens, so nothing changes, and eq. 4's re-proposal of ``x_m`` is the iteration-1 draw,
which the call already fed at column m (as the per-row driver's speculation does), so its logits
give the next position's two draws. At the first position (no window) there is neither sweep nor
re-proposal. k >= 2 sampled is not covered: a changed ``x_m`` needs a new call for the next sweep.

**The step** (:func:`common_step`) is a fixed run of tensor operations around the call the per-row
driver would make (the same query block, the same :class:`~rpt.sampling.proposals.Proposer` and keys,
so the same tokens), a function of the decode state (:class:`~rpt.sampling.decode.state.DecodeState`).
At column m, for every row the path decodes (``state.alive``): write the NTP proposal ``x_m``
(``state.draws[:, 0]``), make the call (``x_m`` -- or sampled k = 1 past the first position, sweep 1's
redraw -- and one PTP chain per lag), propose every token of the call into ``state.pending`` (the
block's :class:`~rpt.sampling.decode.proposal_layout.ProposalLayout`), and set ``state.flags``: whether
any row's logits are NaN / inf, and whether any live row has an *event* -- an accepted correction, an
EOS (in the settled ``x_m``), or its last position (:func:`settle_flags`). Where no row has an event the
step also *commits*: ``x_m = final``, the next proposals into ``state.draws``, column ``m + 1`` into
``state.n``. :func:`step_tail` is everything after the model call (``benchmarks/rpt_tail_compile.py``
compiles it alone, on logits of a real vocabulary, with no model).

**Hand-over.** At an event the step is handed back unfinished: every live row gets a fresh program
resumed at position ``m`` (:func:`~rpt.sampling.algorithm.decode_row` with ``start``), the driver's view
of the cache (through ``m - 1``) and the proposals for ``m``, and the driver runs position ``m`` per row,
reusing the call just made, so an event costs no extra call. The driver hands over again once every
live row has settled a column. What the path needs of the driver is :class:`PerRowDriver`. Stop strings,
token healing and a streamer stay with the per-row driver.

**Compiled** (:class:`CompiledRPTStep`): the model call, every proposal (NTP and the PTP sweep, with their
processors), the event check and the commit in one ``torch.compile`` region over fixed shapes (on CUDA
with inductor, replayed from a CUDA graph: :mod:`rpt.sampling.decode.compile_mode`). Eagerly the step's
proposals run on contexts ``seqs[:, : c + 1]`` whose width grows every step and on the lags that exist
at the column (``1 .. min(w - 1, m - W)``). Compiled, as NTP's (:mod:`rpt.sampling.decode.ntp_path`), the
layout is ``[batch, capacity]``, the step's column the state's 0-dim ``n`` (advanced by the step itself),
the processors read the layout rotated (:class:`~rpt.sampling.decode.contexts.RotatedContexts`), and the
call carries every lag of the window at every column (a chain reaching into the prompt is computed and
ignored: :func:`lag_validity`), so a decode runs **one graph**, the same from its first position ``W`` to
its last column, for every prompt width of its capacity bucket, padded or not. Every input it reads is a
static buffer (the state, the KV cache, the block pattern's tensors), so the graph replays without
copies, and several steps run between two reads of the flags
(:func:`~rpt.sampling.decode.compile_mode.steps_per_read`): a step that hits an event commits nothing,
so those queued after it repeat its column, and the event's column is read from the state.

The event check is ``[batch]`` pointwise work on the call's unpacked proposals
(:class:`~rpt.sampling.proposals.CallProposals`), ORed lag by lag in Python: no small reduction over a
lag axis and no round trip through the packed columns, the shape inductor's CUDA scheduler handles at
every batch size (the NTP step's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from rpt.decode_forward.queries import ModelQueries
from rpt.sampling.config import SamplingConfig
from rpt.sampling.decode.compile_mode import compile_step, steps_per_read
from rpt.sampling.decode.contexts import RotatedContexts
from rpt.sampling.decode.inputs import DecodeInputs
from rpt.sampling.decode.proposal_layout import ProposalLayout
from rpt.sampling.decode.query_block import Block, Pattern
from rpt.sampling.decode.state import DecodeState
from rpt.sampling.decode.step_context import StepContext
from rpt.sampling.processors import caches_at_first_use
from rpt.sampling.proposals import CallProposals, call_proposals, raise_nonfinite


def eligible(inputs: DecodeInputs, streamer) -> bool:
    """Whether the decode of ``inputs`` is RPT with a common step this path covers (greedy, or sampled
    with one iteration) and nothing that needs per-row Python every step."""
    plan = inputs.plan
    return (plan.k >= 1 and plan.w >= 2 and (plan.deterministic or plan.k == 1) and not inputs.config.stop
            and not any(inputs.prompts.prefixes) and streamer is None)


class PerRowDriver(Protocol):
    """What the batch-flat path needs of the per-row driver that owns it
    (:class:`~rpt.sampling.decode.driver.Decoder`)."""

    def flat_start(self, n: int) -> bool:
        """Load the rows' liveness and proposals for n + 1 into the state at column n (every live row has
        settled n); return whether every live row ends at n + 1 with its proposal."""

    def hand_over(self, m: int, block: Block | None = None) -> None:
        """Take the rows back at column m, with the call the path made there (``block``), if it made one."""


class RPTPath:
    """The common steps of one decode's rows between two events (module docstring)."""

    def __init__(self, context: StepContext, rows: PerRowDriver):
        self.context, self.rows = context, rows
        self.steps_past_events = 0  # compiled steps queued after an event (they repeated its column)
        self.queue_depth = 1 << 30  # compiled steps to queue per read (capped per device)
        self._compiled: tuple[CompiledRPTStep, Block, Pattern] | None = None

    def run(self, n: int) -> int:
        """Common steps from column n (every live row has settled n and knows its proposals for n + 1)
        until an event; returns the column the per-row driver goes on settling, the rows handed back."""
        c = self.context
        s = c.state
        nobody_goes_on = self.rows.flat_start(n)
        m = n + 1
        # at the first position (no window yet) the per-row driver makes no call when every live row ends
        # there with its proposal, so neither may this
        if m == c.width and nobody_goes_on:
            s.write_column(m, torch.where(s.alive, s.draws[:, 0], s.column(m)))
            self.rows.hand_over(m)
            return m
        compiled = self.compiled() if c.compile_backend is not None else None
        contexts = c.contexts()
        most = steps_per_read(c.device) if compiled is not None else 1
        while True:
            # the queue's depth halves at each event and doubles after each read without one (up to
            # `most`): rare events cost few reads, frequent ones (corrections) few steps queued past them
            steps = min(self.queue_depth, most, c.last - m + 1)  # every live row stops at the last column at the latest
            for i in range(steps):
                if compiled is not None:  # every lag of the window at every column, its column read from the state
                    step, block, pattern = compiled
                    step(s, c.traced, c.queries, pattern)
                else:
                    block = self.common_block(m + i)
                    pattern = c.pattern(block)
                    common_step(s, c.config, m + i, pattern, contexts, c.eager_call(block, pattern, m + i),
                                s.pending_for(pattern.layout))
            bad, stop = s.flags.tolist()  # the one transfer of the steps since the last
            if bad:
                raise_nonfinite(s.bad.nonzero()[:, 0].tolist())
            if stop:
                event = int(s.n) if steps > 1 else m  # the event's column (a second read, at events only)
                self.steps_past_events += m + steps - 1 - event  # queued after it: they repeated its column
                self.queue_depth = max(1, steps // 2)
                self.rows.hand_over(event, block)
                return event
            m += steps
            self.queue_depth = min(2 * self.queue_depth, most)

    def common_block(self, n: int) -> Block:
        """The block of an eager common step at column n: every row's ``x_n`` and one PTP chain per lag of
        the window (lags ``1 .. min(w - 1, n - W)``)."""
        c = self.context
        return Block(1, tuple(range(1, min(c.window - 1, n - c.width) + 1)), keep_top=n < c.last, keep_prev=False)

    def compiled(self) -> tuple[CompiledRPTStep, Block, Pattern]:
        """The compiled step (built once per pooled buffers, warmed once per decode:
        :meth:`CompiledRPTStep.warm`), its block at every column -- ``x_n``, its NTP logits, and a PTP
        chain per lag of the window (``1 .. w - 1``; those reaching into the prompt are ignored), so that
        one graph serves the whole decode -- and the block's pattern: looked up once per decode, not per
        step."""
        if self._compiled is None:
            c = self.context
            block = Block(1, tuple(range(1, c.window)), keep_top=True, keep_prev=False)
            pattern = c.pattern(block)
            step = c.steps.get("rpt")
            if step is None:
                step = c.steps["rpt"] = CompiledRPTStep(c.compile_backend, c.device)
            step.warm(c.state, c.config, pattern, c.queries.model.config.get_text_config(decoder=True).vocab_size,
                      c.queries.dtype)
            self._compiled = step, block, pattern
        return self._compiled


# ---- the common step as a function of the decode state ------------------------------------------------
def common_ids(seqs: torch.Tensor, pattern: Pattern, n, guess: torch.Tensor | None) -> torch.Tensor:
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


def common_iterations(config: SamplingConfig, lags: tuple[int, ...], batch: int,
                      device: torch.device) -> torch.Tensor | None:
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


def common_step(s: DecodeState, config: SamplingConfig, m, pattern: Pattern, contexts,
                model_call: Callable[..., torch.Tensor], out: torch.Tensor) -> None:
    """The common step at column m (an int, or ``s.n`` inside a compiled step), in place on ``s`` and
    ``out`` (the pending-proposals buffer of ``pattern.layout``; module docstring).

    ``contexts``: :class:`~rpt.sampling.decode.contexts.GrowingContexts` or ``RotatedContexts``;
    ``model_call(ids, positions, columns, visibility, offsets=, keep=)``: the logits of the block's kept
    queries. With an int m the pattern's lags are those that exist at m (``1 .. min(w - 1, m - W)``);
    with the state's ``n`` they are the whole window's at every column, those reaching into the prompt
    computed and ignored (:func:`lag_validity`)."""
    s.write_column(m, torch.where(s.alive, s.draws[:, 0], s.column(m)))
    ids = common_ids(s.seqs, pattern, m, redraw(s, m))
    positions, write, vis, offsets = s.query_inputs(pattern, ids, m)
    logits = model_call(ids, positions, write, vis, offsets=offsets, keep=pattern.keep)
    step_tail(s, config, m, pattern.layout, contexts, logits, ids[:, 0], out)


def step_tail(s: DecodeState, config: SamplingConfig, m, layout: ProposalLayout, contexts, logits: torch.Tensor,
              fed: torch.Tensor, out: torch.Tensor) -> None:
    """The common step after its model call: the call's proposals from ``logits`` ``[batch, K, V]`` into
    ``out``, the flags, and the commit where no live row has an event. ``fed``: ``[batch]``, the token
    the call fed at column m."""
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


# ---- the event check ------------------------------------------------------------------------------------
def lag_validity(s: DecodeState, m, lags: tuple[int, ...]) -> list[torch.Tensor] | None:
    """Per lag, ``[batch]`` bool: whether ``x_{m-l}`` is a generated token (column ``>= W``), for a step
    whose column m is the state's 0-dim ``n`` (the compiled step runs every lag of the window from the
    first position on, one graph for the decode); None for an int m, whose lags are the ones that exist."""
    if isinstance(m, int):
        return None
    return [s.prompt + lag <= m for lag in lags]


def events(seqs: torch.Tensor, props: CallProposals, lags: tuple[int, ...], m,
           valid: list[torch.Tensor] | None) -> torch.Tensor | None:
    """``[batch]`` bool: rows whose sweep at column m (an int or a 0-dim tensor) accepts a proposal that
    differs from the token (None: no lag). ``valid``: :func:`lag_validity`."""
    event = None
    for i, (lag, (tokens, accepted)) in enumerate(zip(lags, props.chains)):
        if isinstance(m, int):
            current = seqs[:, m - lag]
        else:  # x_{m-l}; a column before 0 (a lag past a short prompt, never valid) reads column 0
            current = seqs.index_select(1, (m - lag).clamp(min=0).view(1))[:, 0]
        changed = accepted & (tokens != current)
        if valid is not None:
            changed = changed & valid[i]
        event = changed if event is None else event | changed
    return event


def settle_flags(s: DecodeState, props: CallProposals, lags: tuple[int, ...], x_m: torch.Tensor, m,
                 valid: list[torch.Tensor] | None) -> torch.Tensor:
    """Set ``s.bad`` (``[batch]``: live rows whose logits held NaN / inf, accumulated over the steps since
    the flags were last read, as NTP's) and ``s.flags`` (any bad row; any live row with an event: an
    accepted correction, or ``x_m`` is its last token, EOS or its budget), in place; return the event
    flag (0-dim bool). The event flag is sticky too: a step after one that stopped (and so committed
    nothing) repeats its column, and must not commit either."""
    event = s.ends_at(x_m, m)
    sweep = events(s.seqs, props, lags, m, valid)
    if sweep is not None:
        event = event | sweep
    s.bad |= props.bad & s.alive
    stop = s.flags[1] | (event & s.alive).any()
    s.flags.copy_(torch.stack([s.bad.any(), stop]))
    return stop


# ---- the compiled step ------------------------------------------------------------------------------------
def fixed_common_step(s: DecodeState, config: SamplingConfig, queries: ModelQueries, pattern: Pattern,
                      out: torch.Tensor) -> None:
    """:func:`common_step` at the state's column on fixed shapes: the whole cache, rotated contexts."""
    contexts = RotatedContexts(config, s.seeds, s.seqs, s.prompt, s.pads, s.knobs)  # the knobs' values: tensors
    common_step(s, config, s.n, pattern, contexts, queries.whole_cache_step, out)


class CompiledRPTStep:
    """``step(state, config, queries, pattern)``: :func:`fixed_common_step` compiled. Owned by the pooled
    :class:`~rpt.sampling.decode.buffers.DecodeBuffers` whose state and queries it is called with."""

    def __init__(self, backend, device: torch.device):
        self._compiled = compile_step(fixed_common_step, backend, device)

    @staticmethod
    def warm(s: DecodeState, config: SamplingConfig, pattern: Pattern, vocab: int, dtype: torch.dtype) -> None:
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

    def __call__(self, s: DecodeState, traced: SamplingConfig, queries: ModelQueries, pattern: Pattern) -> None:
        """One step; ``traced``: the decode's :meth:`~rpt.sampling.config.SamplingConfig.traced` config (the
        values of its float knobs in ``s.knobs``: one graph for every confidence, temperature, penalty)."""
        out = s.pending_for(pattern.layout)  # allocated outside the graph, at its first use
        with queries.whole_cache_calls():
            self._compiled(s, traced, queries, pattern, out)
