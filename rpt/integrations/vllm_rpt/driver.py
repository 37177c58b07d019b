r"""One serving request's RPT decode, driven from an engine's steps (no vLLM import).

The request's :class:`~rpt.sampling.algorithm.Row` and its **unchanged**
:func:`~rpt.sampling.algorithm.decode_row` program are driven by the logits of the rows an engine step
fed (:mod:`rpt.integrations.vllm_rpt.codes` states the row layout). After a step, :meth:`RequestDriver.step`

* answers every pending request the step's rows cover, with the proposal rules and keyed draws of
  both project decoders (:class:`~rpt.sampling.proposals.Proposer`, as :mod:`rpt.sampling.reference`
  calls it): an NTP request for ``x_t`` from the NTP row of ``x_{t-1}``, a PTP request for ``x_j``
  from the last row of the chain of lag ``t - j`` -- each only when the tokens that row saw are the
  row's current ones (a correction makes the rows after it stale);
* returns the tokens that became final: those older than the window of the newest position, or all
  of them once the program ends (EOS, budget);
* plans the next step's rows (:meth:`RequestDriver.drafts`): the tail, and the chains of the lags the
  pending sweep asks for.

Emitted tokens never change, and the tail is fed again every step, so a replaced token needs no
rollback: the next step's rows are computed from the current tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rpt.integrations.vllm_rpt.codes import chain_ids, chain_rows
from rpt.integrations.vllm_rpt.settings import RPTSettings
from rpt.sampling.algorithm import NTPRequest, Plan, PTPRequest, Request, Row, decode_row
from rpt.sampling.proposals import Proposer, nonfinite
from rpt.sampling.text.stopping import StopChecker


@dataclass(frozen=True)
class Block:
    """The rows one step feeds for a request: NTP rows at positions ``first .. n`` (``first``: the
    engine's re-fed last final token), then the chains of lags ``1 .. lags`` ending at ``n``;
    ``tokens``: the row's tokens ``0 .. n`` when it was planned (what the rows saw)."""

    first: int
    n: int
    lags: int
    tokens: tuple[int, ...]

    @property
    def ntp_rows(self) -> int:
        return self.n - self.first + 1

    @property
    def rows(self) -> int:
        return self.ntp_rows + chain_rows(self.lags)

    def chain_end(self, lag: int) -> int:
        """The row index of the last token of the chain of lag ``lag``."""
        return self.ntp_rows + chain_rows(lag) - 1


class RequestDriver:
    """A request's row, program and proposer; fed the logits of each step's rows.

    Args:
        prompt: the prompt's token ids.
        settings: the request's RPT settings (:func:`~rpt.integrations.vllm_rpt.settings.parse_settings`).
        max_new: its token budget (:func:`~rpt.integrations.vllm_rpt.settings.rpt_budget`).
        stop_ids: the token ids that end it (EOS and stop ids; none when EOS is ignored).
    """

    def __init__(self, prompt: list[int], settings: RPTSettings, max_new: int, stop_ids=()):
        config = settings.config
        self.w = config.rpt_window
        self.row = Row(list(prompt), max_new=max_new)
        plan = Plan(k=config.rpt_iters, w=self.w, max_new=max_new, deterministic=config.deterministic,
                    stopper=StopChecker(list(stop_ids), (), None, window=self.w))
        self.proposer = Proposer(config, len(prompt), torch.tensor([settings.row_seed]))
        self.program = decode_row(self.row, plan)
        self.requests: list[Request] | None = next(self.program) if max_new > 0 else None
        self.final = len(prompt)  # tokens the engine holds (prompt and emitted)
        # the engine's first step is the prefill: its one row is the prompt's last token
        self.block = Block(len(prompt) - 1, len(prompt) - 1, 0, tuple(prompt))
        self.steps = 0

    @property
    def finished(self) -> bool:
        return self.requests is None

    @property
    def corrections(self) -> int:
        return self.row.corrections

    # ---- answering --------------------------------------------------------------------------------
    def _saw(self, lo: int, hi: int) -> bool:
        """The planned block fed positions ``lo .. hi - 1`` as the row holds them now."""
        return list(self.block.tokens[lo:hi]) == self.row.tokens[lo:hi]

    def _ids(self, end: int) -> torch.Tensor:
        return torch.tensor([self.row.tokens[:end]], dtype=torch.long)

    def _answer(self, request: Request, logits: torch.Tensor):
        """The answer to ``request`` from this step's rows, or None when they do not cover it."""
        b, fed = self.block, logits.shape[0]
        if isinstance(request, NTPRequest):
            r = request.t - 1 - b.first
            if not (0 <= r < min(b.ntp_rows, fed)) or not self._saw(b.first, request.t):
                return None
            draws = self.proposer.ntp(self._ids(request.t), self._row(logits, r), request.t)
            return int(draws[0, min(request.it, draws.shape[1] - 1)])
        j, t, lag = request.j, request.t, request.lag
        if t != b.n or lag > b.lags or b.chain_end(lag) >= fed:
            return None
        if not (self._saw(b.first, j) and self._saw(j + 1, t + 1)):
            return None
        tokens, accepted = self.proposer.ptp(self._ids(j), self._row(logits, b.chain_end(lag)), t, request.it, lag)
        return int(tokens[0]), bool(accepted[0])

    @staticmethod
    def _row(logits: torch.Tensor, r: int) -> torch.Tensor:
        row = logits[r: r + 1].clone()  # the proposer edits its logits in place
        if bool(nonfinite(row)[0]):
            raise FloatingPointError("the model's logits hold NaN or inf for this request: a float16 overflow or "
                                     "broken weights; serve the model in bfloat16 or float32")
        return row

    def step(self, logits: torch.Tensor) -> list[int]:
        """Advance on the logits ``[rows, V]`` of the planned block's rows (the first ``rows`` of them:
        an engine may feed fewer) and return the tokens that became final."""
        self.steps += 1
        while self.requests is not None:
            answers = []
            for request in self.requests:
                answer = self._answer(request, logits)
                if answer is None:
                    break
                answers.append(answer)
            if not answers:
                break
            try:  # a sweep takes its answers in order; the ones not given are asked again
                self.requests = self.program.send(answers)
            except StopIteration:
                self.requests = None
        return self._emit()

    def _emit(self) -> list[int]:
        tokens = self.row.tokens
        if self.requests is None:
            end = len(tokens)  # the program ended (EOS, budget): everything left is final
        else:
            end = max(self.requests[0].t - self.w + 1, self.final)  # older than the pending position's window
        out, self.final = tokens[self.final:end], end
        return out

    # ---- planning ---------------------------------------------------------------------------------
    def plan(self) -> Block:
        """The next step's block: NTP rows from the engine's re-fed token to the newest one, and the
        chains the pending sweep asks for."""
        n = len(self.row.tokens) - 1
        pending = self.requests or []
        lags = max((r.lag for r in pending if isinstance(r, PTPRequest)), default=0)
        self.block = Block(self.final - 1, n, lags, tuple(self.row.tokens))
        return self.block

    def drafts(self, vocab_size: int) -> list[int]:
        """The ids the next step feeds after the engine's re-fed token (:mod:`~rpt.integrations.vllm_rpt.codes`)."""
        if self.requests is None:
            return []
        b = self.plan()
        return list(b.tokens[b.first + 1:]) + chain_ids(list(b.tokens), b.n, b.lags, vocab_size)
