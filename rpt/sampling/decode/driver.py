r"""``Decoder``: the per-row driver of ``generate`` -- the RPT algorithm driven on a KV cache, all rows
batched, one model call per new token on the common path.

The algorithm is :func:`rpt.sampling.algorithm.decode_row` (read that first); the uncached reference
(:mod:`rpt.sampling.reference`) drives the same statement. This driver answers the requests of all
rows with one call of :class:`~rpt.decode_forward.queries.ModelQueries` per round, in a few pure steps: plan the
call (a :class:`~rpt.sampling.decode.query_block.Block`), build its inputs, call the model, propose, hand
the answers back. :func:`~rpt.sampling.decode.generate.generate` builds it and runs it.

**Layout.** The prompts are left-padded to width ``W``; every row's position p sits at column
``p + pad``. Rows advance in lockstep: all settle column ``n`` before any moves to ``n + 1`` (so the
processors see one ``[batch, n + 1]`` context). Cache column c holds the NTP KV of the token last
fed at column c; the driver remembers which token that was (``kv`` of each row's
:class:`~rpt.sampling.decode.row_slot.Slot`), so the cache serves a row up to its first column whose token
changed since, whatever changed it.

**A call at column n** feeds, for every row, the same block of queries:

* the *NTP region*, columns ``n - R + 1 .. n`` (offset row 0), rewriting their KV in place; R covers
  each row's first stale column (usually R = 1: the new ``x_n``). Its logits at ``n`` give every
  row's NTP proposals for ``x_{n+1}`` (one per RPT iteration: drawn once, kept until the prefix
  changes); those at ``n - 1`` the re-proposal of ``x_n`` after a sweep changed an earlier token;
* one *PTP chain* per lag ``l`` some row asks for: ``x_{n-l+1}, ..., x_n`` in scratch columns past
  ``n``, offset rows ``1..l``, seeing the columns before ``x_{n-l}`` and its own earlier tokens; its
  last logits are ``p(x_{n-l} | x_<n-l, x_{n-l+1..n})`` (eq. 8).

**Common path** (no correction accepted, greedy): the NTP proposal for ``x_n`` is already known, the
sweep needs its chains, and the call that computes them also feeds ``x_n`` and so gives the proposal
for ``x_{n+1}``: one call per token, and one device-to-host transfer per call (every proposal and
acceptance of the call together). After an accepted correction at column j the columns from j on
are stale; the next call's region starts at j and rewrites them. At temperature > 0 every sweep is
followed by a redraw of ``x_n`` whose value is known before the call (a keyed draw from logits the
driver has, unless the sweep changes the prefix): the call feeds that value at column n instead of
the current one, so its logits at n are already those the next position needs.

**Batch-flat steps.** Plain NTP runs :class:`~rpt.sampling.decode.ntp_path.NTPPath` instead of this loop;
greedy RPT (and sampled RPT with k = 1) hands its common steps (nobody corrects or stops) to
:class:`~rpt.sampling.decode.rpt_path.RPTPath` whenever every row has settled a column, and gets the rows
back, with the call already made, at the first event (:meth:`Decoder.flat_start`, :meth:`Decoder.hand_over`:
what the path needs of this driver, :class:`~rpt.sampling.decode.rpt_path.PerRowDriver`). Both paths and
this driver work on one :class:`~rpt.sampling.decode.step_context.StepContext`: the state, the model
queries, the proposer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from rpt.decode_forward.compile_guard import CompileFailure
from rpt.decode_forward.kv_cache import sliding_window_of
from rpt.decode_forward.queries import ModelQueries, batch_bucket, capacity_bucket, implementation_of
from rpt.sampling.algorithm import NTPRequest, Request, Row, decode_row
from rpt.sampling.decode import ntp_path, rpt_path
from rpt.sampling.decode.buffers import DecodeBuffers, borrow, buffers_key, give_back
from rpt.sampling.decode.inputs import DecodeInputs
from rpt.sampling.decode.ntp_path import NTPPath
from rpt.sampling.decode.proposal_layout import ProposalLayout
from rpt.sampling.decode.query_block import Block, MadeCall, Pattern
from rpt.sampling.decode.row_slot import Slot
from rpt.sampling.decode.rpt_path import RPTPath
from rpt.sampling.decode.state import DecodeState
from rpt.sampling.decode.step_context import StepContext
from rpt.sampling.output import GenerateOutput, assemble
from rpt.sampling.proposals import Proposer, block_proposals, ntp_draws, raise_nonfinite
from rpt.sampling.text.healing import TokenHealingLogitsProcessor

WAIT, READY, BLOCKED = "wait", "ready", "blocked"


class Decoder:
    """One ``generate`` call: the rows' programs, the device state, the model queries. A context manager:
    leaving it gives the borrowed buffers back (:meth:`close`)."""

    def __init__(self, model, inputs: DecodeInputs, input_ids: torch.Tensor, streamer, start: float,
                 compile: bool | str | Callable):
        self.start = start
        self.config = config = inputs.config
        self.inputs, self.input_ids, self.streamer = inputs, input_ids, streamer
        self.prompts = prompts = inputs.prompts
        self.budgets, self.plan, self.pad_id, self.seeds = inputs.budgets, inputs.plan, inputs.pad_id, inputs.seeds
        k = self.plan.k
        self.device = input_ids.device
        self.W = W = prompts.width
        self.last = W + self.plan.max_new - 1  # last column to generate
        scratch = config.rpt_window * (config.rpt_window - 1) // 2 if k else 0
        capacity = self.last + 2 + scratch + (8 if compile else 0)
        # a backend name, or a callable backend (tests count what runs inside the compiled region)
        self.compile_backend = (compile if not isinstance(compile, bool) else "inductor") if compile else None
        self._lent: DecodeBuffers | None = None  # the pool's entry this decode borrowed (close gives it back)
        self.buffers = self._buffers(model, capacity, len(prompts.rows))
        self.queries, self.state = self.buffers.queries, self.buffers.state
        self.queries.check_each_call = False  # checked once, here: the fused call against the model, its copies refilled
        self.queries.sync()
        # what a compile failure of this decode is keyed to: the graphs' config and the model's fused call
        # (its length, seed and stop strings change no graph)
        self.cause = (dataclasses.replace(config.traced(), max_new_tokens=1, seed=None, stop=[]), self.queries.epoch)
        if self._lent is not None:
            self._skip_remembered_failure()
        self.batch = self.state.seqs.shape[0]  # compiled: the batch bucket (rows past the decode's are inert)
        # the rows' current tokens (the processors' contexts), budgets, seeds and EOS ids (none: -1,
        # an id no token has, keeps isin's shape fixed) and the float knobs in the state's buffers
        self.state.load(prompts.rows, W, prompts.pads, self.budgets, self.seeds, config.eos_token_ids, self.pad_id,
                        config.knob_values())
        # a compiled step traces this config, reading the knobs' values from the state (one graph for all)
        self.traced = config.traced() if self.compile_backend is not None else config
        padding = [b""] * (self.batch - len(prompts.rows))
        healing = TokenHealingLogitsProcessor(prompts.vocab, prompts.prefixes + padding, W) \
            if any(prompts.prefixes) else None
        self.proposer = Proposer(config, W, self.state.seeds, pad_length=self.state.start_cols, healing=healing)
        self.context = StepContext(config=config, traced=self.traced, state=self.state, queries=self.queries,
                                   proposer=self.proposer, device=self.device, width=W, last=self.last,
                                   window=self.plan.w, compile_backend=self.compile_backend, steps=self.buffers.steps)
        # after a sweep that changes nothing, x_n is redrawn from logits already known: feed that draw
        # at column n already, so the call that computes the sweep also gives the next position's NTP
        self.speculate = not config.greedy
        # greedy or sampled k = 1 RPT: common steps batch-flat (None: every step per row)
        self.flat_rpt: RPTPath | None = RPTPath(self.context, self) if rpt_path.eligible(inputs, streamer) else None
        self.slots = [self._slot(b, streamer) for b in range(len(prompts.rows))]
        self.writes: list[tuple[int, int, int]] = []
        self.guesses: list[tuple[int, int]] = []  # (row, token) fed at column n in place of x_n this call
        self.pending: MadeCall | None = None  # set by hand_over, taken by the next round

    def _buffers(self, model, capacity: int, batch: int) -> DecodeBuffers:
        """The model queries (KV cache) and decode state: a compiled decode borrows them from the pool of
        its bucket (:mod:`rpt.sampling.decode.buffers`, given back by :meth:`close`) -- capacity and batch
        bucketed (:func:`~rpt.decode_forward.queries.batch_bucket`), so that an evaluation meets a bounded set of shapes;
        an eager one allocates its own (exactly ``capacity`` columns and ``batch`` rows), freed with this
        decoder."""
        draws, eos = ntp_draws(self.config), len(self.config.eos_token_ids)
        if self.compile_backend is None:
            return DecodeBuffers(ModelQueries(model, capacity),
                                 DecodeState.allocate(batch, self.last + 2, draws, eos, self.device))
        capacity, batch = capacity_bucket(capacity, sliding_window_of(model)), batch_bucket(batch)
        # the model's dtype, device and attention implementation fix what the pooled queries decided
        key = buffers_key(batch, capacity, self.plan.w, draws, eos, self.compile_backend) + (
            self.device, model.dtype, implementation_of(model))

        def build() -> DecodeBuffers:
            queries = ModelQueries(model, capacity, compile=True, compile_backend=self.compile_backend)
            return DecodeBuffers(queries, DecodeState.allocate(batch, capacity, draws, eos, self.device, static=True))

        self._lent, _ = borrow(model, key, build)
        return self._lent

    def _skip_remembered_failure(self) -> None:
        """Raise the bucket's remembered compile failure where this decode has its cause and is to run eagerly
        at once (:meth:`DecodeBuffers.skip <rpt.sampling.decode.buffers.DecodeBuffers.skip>`)."""
        reason = self._lent.skip(self.cause)
        if reason is not None:
            self._lent = give_back(self._lent)
            raise CompileFailure(reason)

    @property
    def lent(self) -> DecodeBuffers | None:
        """The pool's entry this decode borrowed (None: an eager decode, or given back)."""
        return self._lent

    def close(self) -> None:
        """Give the borrowed buffers back to the pool (a compiled decode; nothing for an eager one)."""
        lent, self._lent = self._lent, None
        if lent is not None:
            give_back(lent)

    def __enter__(self) -> Decoder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _slot(self, b: int, streamer) -> Slot:
        p = self.prompts
        row = Row(p.rows[b], p.prefixes[b], p.vocab, streamer, stream_lag=self.plan.w - 1 if self.plan.k else 0,
                  max_new=self.budgets[b])
        slot = Slot(b, row, decode_row(row, self.plan), p.pads[b], self.pad_id, [None] * (self.last + 2),
                     low=p.pads[b])
        slot.requests = next(slot.program)
        row.take_dirty()  # the prompt is in the layout already
        return slot

    # ---- answering from what is known --------------------------------------------------------------
    def _state(self, s: Slot, n: int) -> str:
        """WAIT (for column n + 1), READY (answerable now) or BLOCKED (needs a model call)."""
        first = s.requests[0]
        if isinstance(first, NTPRequest):
            c = first.t + s.pad
            if c > n:
                return WAIT
            return READY if s.usable(c, n) is not None else BLOCKED
        return BLOCKED

    def _answer_known(self, s: Slot, n: int) -> None:
        """Resume the program while its requests are answerable without a model call."""
        while s.requests is not None and self._state(s, n) == READY:
            request = s.requests[0]
            draws = s.usable(request.t + s.pad, n)
            self._send(s, [draws[min(request.it, len(draws) - 1)]])

    def _send(self, s: Slot, answers: list) -> None:
        try:
            s.requests = s.program.send(answers)
        except StopIteration:
            s.requests = None
        dirty = s.row.take_dirty()
        if dirty is not None:  # the row rewrote tokens: the processors' contexts must see them
            self.writes += [(s.index, p + s.pad, s.row.tokens[p]) for p in range(dirty, len(s.row.tokens))]

    # ---- one model call ----------------------------------------------------------------------------
    def _needs(self, s: Slot, n: int, chains: dict) -> tuple[int, bool]:
        """The first column row s needs fed, and whether it needs the logits at n - 1."""
        first, state = s.served_upto(n), self._state(s, n)
        if state == WAIT:
            return (first if s.usable(n + 1, n) is not None else min(first, n)), False
        if isinstance(s.requests[0], NTPRequest):  # the re-proposal of x_n over a changed prefix
            return min(first, n - 1), True
        chains[s.index] = {r.lag: r for r in s.requests}
        draws = s.usable(n, n) if self.speculate else None
        guess = None if draws is None else draws[min(s.requests[0].it, len(draws) - 1)]
        if guess is not None and guess != s.token(n):
            s.feed[n] = guess  # x_n as it will be if this sweep changes nothing
            self.guesses.append((s.index, guess))
            return min(first, n), False
        return first, False

    def _plan(self, live: list[Slot], n: int) -> tuple[Block, dict[int, dict[int, Request]]]:
        """The block every row's needs fit in, and each blocked row's PTP requests by lag."""
        start, keep_prev, chains = n + 1, False, {}
        for s in self.slots:
            s.feed.clear()
        self.guesses.clear()
        for s in live:
            first, prev = self._needs(s, n, chains)
            start, keep_prev = min(start, first), keep_prev or prev
        lags = tuple(sorted({lag for by_lag in chains.values() for lag in by_lag}))
        region = n + 1 - start
        return Block(region, lags, keep_top=region > 0 and n < self.last, keep_prev=keep_prev), chains

    def apply_writes(self) -> None:
        if len(self.writes) <= 2 and self.device.type == "cpu":  # the common path: scalar writes are cheapest
            for b, c, token in self.writes:
                self.state.seqs[b, c] = token
        elif self.writes:
            w = self.context.to_device(self.writes)
            self.state.seqs[w[:, 0], w[:, 1]] = w[:, 2]
        self.writes.clear()

    def _ids(self, pattern: Pattern, block: Block, n: int) -> torch.Tensor:
        """``[batch, Q]`` tokens of the block: the rows' current tokens at each query's source column
        (one gather from ``seqs``, which mirrors them), and at column n a row's guess where it made one."""
        ids = self.state.seqs.index_select(1, pattern.src + n)
        if self.guesses:  # column n is the region's last query
            g = self.context.to_device(self.guesses)
            ids[g[:, 0], block.region - 1] = g[:, 1]
        return ids

    def _iterations(self, block: Block, chains: dict) -> torch.Tensor | None:
        """``[lags, batch]``: the RPT iteration keying each row's draw for each chain (0 where unused)."""
        if not block.lags or self.proposer.ptp_samples_greedy:  # argmax proposals draw nothing
            return None
        return self.context.to_device([[chains[b][lag].it if lag in chains.get(b, {}) else 0 for b in range(self.batch)]
                                for lag in block.lags])

    def _proposals(self, logits: torch.Tensor, ids: torch.Tensor, block: Block, layout: ProposalLayout,
                   its: torch.Tensor | None, n: int) -> torch.Tensor:
        """Every proposal of the call (:func:`~rpt.sampling.proposals.block_proposals`), on the device: the
        caller moves it to the host with one transfer. The NTP proposal for n + 1 conditions on the token
        fed at column n (a row's guess, if it made one)."""
        fed = ids[:, block.region - 1] if block.keep_top else None
        return block_proposals(self.context.contexts(), logits, n, n - self.state.pads, fed, layout, its)

    def _record(self, s: Slot, vals: list[int], block: Block, layout: ProposalLayout, n: int) -> None:
        """What the call fed for row s, and the NTP proposals it computed (``vals``: the row's of
        :meth:`_proposals`, in ``layout``'s columns)."""
        changed = n + 1
        for c in range(n - block.region + 1, n + 1):
            fed = s.feed.get(c, s.token(c))
            if s.kv[c] != fed:
                changed, s.kv[c] = min(changed, c), fed
        if changed <= n:  # draws computed over KV that was just replaced are stale (none if nothing changed)
            for c in [c for c in s.draws if c > changed]:
                del s.draws[c]
        if block.region > 0:  # the cache now serves the row through n: no older column changes
            low = max(s.low, n - self.plan.w)
            for c in range(s.low, low):  # nor is any older column's proposal asked for again
                s.draws.pop(c, None)
            s.low = low
        if layout.keep_top:
            s.draws[n + 1] = vals[layout.top]
        if layout.keep_prev:
            s.draws[n] = vals[layout.prev]

    def _deliver(self, live: list[Slot], vals: list[list[int]], block: Block, layout: ProposalLayout, chains: dict,
                 n: int) -> None:
        for s in live:
            self._record(s, vals[s.index], block, layout, n)
            if s.index in chains:
                answers = layout.answers(vals[s.index])
                self._send(s, [answers[r.lag] for r in s.requests])

    def _round(self, live: list[Slot], n: int) -> None:
        block, chains = self._plan(live, n)
        pending, self.pending = self.pending, None
        self.apply_writes()  # host-to-device copies first, while the device is idle
        pattern = self.context.pattern(block)
        if pending is not None and pending.n == n and pending.block.covers(block):  # the RPT path made this call
            block, pattern = pending.block, self.context.pattern(pending.block)  # (with every lag of the window, compiled)
            vals = pending.vals
        else:
            ids, its = self._ids(pattern, block, n), self._iterations(block, chains)
            logits = self.context.logits(block, pattern, ids, n)
            vals = self._proposals(logits, ids, block, pattern.layout, its, n).tolist()
        # padding rows of finished ones aside
        raise_nonfinite([s.index for s in live if vals[s.index][ProposalLayout.flag]])
        self._deliver(live, vals, block, pattern.layout, chains, n)

    # ---- the rows handed to the batch-flat RPT path and back (rpt_path.PerRowDriver) -----------------
    def flat_start(self, n: int) -> bool:
        """Where the batch-flat RPT path starts at column n (every live row has settled n): the rows'
        writes applied, and into the state which rows are live, their proposals for n + 1 (a finished
        row's: pad ids) and the step's column n + 1. Returns whether every live row ends at n + 1 with
        its proposal (EOS, or its budget's last column), from the host's lists: no read."""
        self.apply_writes()
        self.state.flags.zero_()  # the steps accumulate NaN rows and events until a read
        self.state.bad.zero_()
        live = [s.requests is not None for s in self.slots]
        finished = [self.pad_id] * self.proposer.ntp_draws
        draws = [s.usable(n + 1, n) if on else finished for s, on in zip(self.slots, live)]
        padding = self.batch - len(self.slots)  # a batch bucket's inert rows: never alive
        self.state.alive.copy_(self.context.to_device(live + [False] * padding).bool())
        self.state.draws.copy_(self.context.to_device(draws + [finished] * padding))
        self.state.n.fill_(n + 1)
        eos = set(self.config.eos_token_ids)
        return all(d[0] in eos or self.W - 1 + self.budgets[b] <= n + 1 for b, (d, on) in enumerate(zip(draws, live))
                   if on)

    def hand_over(self, m: int, block: Block | None = None) -> None:
        """Take every live row back from the batch-flat path at column m (:meth:`Slot.resume`), with its
        proposals for m (the state's ``draws``); ``block``: the call the path made at m, if it made one,
        whose proposals wait in the state (:attr:`pending`, which the per-row round at m reuses)."""
        s = self.state
        parts = [s.seqs[:, :m], s.draws] + ([] if block is None else [s.pending_for(self.context.pattern(block).layout)])
        host = torch.cat(parts, 1).tolist()  # one transfer
        end = m + s.draws.shape[1]  # each host row: the layout before m, the draws, the call's proposals
        for slot in self.slots:
            if slot.requests is not None:
                row = host[slot.index]
                slot.resume(row[:m], m, self.plan, row[m:end])
        self.pending = None if block is None else MadeCall(m, block, [row[end:] for row in host])

    # ---- the decode loop ---------------------------------------------------------------------------
    def run(self) -> GenerateOutput:
        if ntp_path.eligible(self.inputs, self.streamer):  # plain NTP: all rows as tensors, no per-row Python per step
            generated, reasons = NTPPath(self.context).run()
            return self._output(generated, reasons, {"forward_passes": self.queries.calls, "corrections": 0})
        n = self.W - 1  # the column being settled (the prompts' last, to start: the prefill)
        live = list(self.slots)
        while live:
            for s in live:
                self._answer_known(s, n)
            live = [s for s in live if s.requests is not None]
            if not live:
                break
            if any(self._state(s, n) == BLOCKED or s.usable(n + 1, n) is None for s in live):
                self._round(live, n)
            elif self.flat_rpt is not None:  # common steps batch-flat until some row needs its program
                n = self.flat_rpt.run(n)
            else:
                n += 1  # every live row has settled column n and knows its proposal for n + 1
        rows = [s.row for s in self.slots]
        # forward passes the algorithm made; the steps queued past an event ran the model for nothing
        past_events = 0 if self.flat_rpt is None else self.flat_rpt.steps_past_events
        stats = {"forward_passes": self.queries.calls - past_events, "corrections": sum(r.corrections for r in rows)}
        if past_events:
            stats["steps_past_events"] = past_events
        return self._output([r.generated for r in rows], [r.reason for r in rows], stats)

    def _output(self, generated: list[list[int]], reasons: list[str], stats: dict) -> GenerateOutput:
        return assemble(self.input_ids, self.prompts, generated, reasons, self.pad_id, stats, self.start,
                        healed=self.config.token_healing, seeds=self.seeds)

