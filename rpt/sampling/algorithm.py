r"""RPT sampling (the paper's eq. 4, and eq. 6 for ``w = 3``), stated once for both decoders.

:func:`decode_row` is one prompt's decode as a generator. It never calls the model: it *yields* a
list of requests and is sent back their answers, in order:

* :class:`NTPRequest` ``(t, it)``: a proposal for ``x_t`` from ``p(x_t | x_<t)`` (the answer is a
  token);
* :class:`PTPRequest` ``(j, t, it)``: a proposal for ``x_j`` from ``p(x_j | x_<j, x_{j+1..t})``
  (eq. 8 with ``l = t - j``; the answer is ``(token, accepted)``),

each given the row's tokens *at the time of the yield*; ``it`` and the lag key the draw
(:mod:`rpt.sampling.randomness`), so the answer does not depend on who computes it or when. The
reference decoder (:mod:`rpt.sampling.reference`) answers each request with one uncached model call;
the fast decoder (:mod:`rpt.sampling.decode.driver`) batches the requests of all rows into one call
on a KV cache and answers NTP requests from logits it already has when the prefix is unchanged.

For each new position t (0-based, prompt ``x_<P``):

1. NTP: ``x_t`` from ``p(x_t | x_<t)``.
2. ``k = rpt_iters`` iterations over the window ``j = lo .. t-1``, ``lo = max(t - w + 1, P)``
   (and never a token token healing froze). Iteration i is a PTP sweep, oldest first: ``x_j`` is
   replaced by its proposal from ``p(x_j | x_<j, x_{j+1..t})`` when accepted (probability above
   ``confidence``); then ``x_t`` is re-proposed by NTP given the current prefix (eq. 4's second
   line: after *every* sweep, whether or not it changed anything; when nothing changed, that is a
   fresh draw from the same conditional). Iterations stop early only when both proposals are
   deterministic (greedy NTP, greedy PTP) and the sweep changed nothing: every further iteration
   would repeat it exactly.
3. The row stops on EOS or a stop string (:class:`~rpt.sampling.text.stopping.StopChecker`) once t has
   settled; tokens older than the window are final and go to the streamer.

Within a sweep, the proposals for all remaining window positions are requested together (given the
current tokens); when one is accepted and changes ``x_i``, the later ones conditioned on the old
``x_i`` and are requested again. This is the sequential sweep exactly, and lets a decoder answer a
whole unchanged sweep in one call.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

from rpt.sampling.text.healing import HealingFrontier, TokenVocabulary
from rpt.sampling.text.stopping import StopChecker
from rpt.sampling.text.token_stream import FrozenStream


@dataclass(frozen=True)
class NTPRequest:
    """Propose ``x_t`` from ``p(x_t | x_<t)`` for RPT iteration ``it`` (0: the first proposal)."""

    t: int
    it: int


@dataclass(frozen=True)
class PTPRequest:
    """Propose ``x_j`` from ``p(x_j | x_<j, x_{j+1..t})`` in sweep ``it``; answered ``(token, accepted)``."""

    j: int
    t: int
    it: int

    @property
    def lag(self) -> int:
        return self.t - self.j


Request = NTPRequest | PTPRequest
Program = Generator[list[Request], list, None]


@dataclass(frozen=True)
class Plan:
    """The settings every row of a decode shares."""

    k: int  # RPT iterations (0: plain NTP)
    w: int  # window
    max_new: int  # the longest row budget (a row's own: Row.max_new)
    deterministic: bool  # greedy NTP and greedy PTP: an unchanged sweep ends the iterations
    stopper: StopChecker


class Row:
    """One prompt's tokens (positions ``0..``: prompt, then generated) and what the decode knows of them.

    ``dirty`` is the first position written (appended or replaced) since a driver last called
    :meth:`take_dirty`: everything a driver computed from that position on is stale.
    """

    def __init__(self, prompt: list[int], prefix: bytes = b"", vocab: TokenVocabulary | None = None,
                 streamer=None, stream_lag: int = 0, max_new: int | None = None):
        self.tokens = list(prompt)
        self.max_new = max_new  # this row's budget (None: the plan's)
        self.prompt_length = len(prompt)
        self.frontier = HealingFrontier(vocab, prefix)
        self.stream = FrozenStream(streamer, prompt, stream_lag)
        self.dirty: int | None = None
        self.corrections = 0
        self.reason = "length"

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_length:]

    def _touch(self, position: int) -> None:
        self.dirty = position if self.dirty is None else min(self.dirty, position)

    def append(self, token: int) -> None:
        self.tokens.append(token)
        self._touch(len(self.tokens) - 1)

    def set(self, position: int, token: int) -> None:
        self.tokens[position] = token
        self._touch(position)

    def take_dirty(self) -> int | None:
        dirty, self.dirty = self.dirty, None
        return dirty

    def window_start(self, t: int, w: int) -> int:
        """The first position the window of t may revisit: generated, in the window, not frozen by healing."""
        return max(t - w + 1, self.prompt_length + self.frontier.first_revisable(t - self.prompt_length))

    def settle(self, t: int, plan: Plan) -> bool:
        """Position t is final for this iteration budget: healing, stop checks, streaming. True when done."""
        generated = self.generated
        self.frontier.update(generated)
        reason, keep = plan.stopper.check(generated, since=t - plan.w + 1 - self.prompt_length)
        if reason is None:
            self.stream.update(generated)
            return False
        del self.tokens[self.prompt_length + keep:]
        self.reason = reason
        return True


def sweep(row: Row, lo: int, t: int, it: int) -> Generator[list[Request], list, bool]:
    """One PTP sweep over ``x_lo .. x_{t-1}``, oldest first; returns whether it changed a token."""
    changed, j = False, lo
    while j < t:
        answers = yield [PTPRequest(i, t, it) for i in range(j, t)]
        for i, (token, accepted) in zip(range(j, t), answers):
            j = i + 1
            if accepted and token != row.tokens[i]:
                row.set(i, token)
                row.corrections += 1
                changed = True
                break  # the proposals after i were conditioned on the old x_i: ask again
    return changed


def resample_window(row: Row, t: int, plan: Plan) -> Generator[list[Request], list, None]:
    """The RPT iterations at position t (eq. 4 / eq. 6)."""
    lo = row.window_start(t, plan.w)
    if lo >= t:
        return
    for it in range(1, plan.k + 1):
        changed = yield from sweep(row, lo, t, it)
        if not changed and plan.deterministic:
            return  # greedy NTP would keep x_t and greedy PTP repeat this sweep exactly
        (token,) = yield [NTPRequest(t, it)]  # x_t again, given the (possibly new) prefix
        if token != row.tokens[t]:
            row.set(t, token)


def decode_row(row: Row, plan: Plan, start: int | None = None) -> Program:
    """A prompt's whole decode: NTP proposal, RPT iterations, stop checks, position after position.

    ``start``: resume at that position, the row holding its settled tokens before it (a driver that
    ran the earlier positions itself, :mod:`rpt.sampling.decode.rpt_path`); default the prompt's end."""
    budget = plan.max_new if row.max_new is None else row.max_new
    for t in range(row.prompt_length if start is None else start, row.prompt_length + budget):
        (token,) = yield [NTPRequest(t, 0)]
        row.append(token)
        if plan.k:
            yield from resample_window(row, t, plan)
        if row.settle(t, plan):
            break
    row.stream.end(row.generated)
