r"""``generate_reference``: the RPT algorithm driven as plainly as possible, the test oracle.

No KV cache, one row at a time: every request of :func:`rpt.sampling.algorithm.decode_row` is
answered by one model call on the row's current tokens, recomputed from scratch:

* ``NTPRequest(t)``: the plain causal LM on ``x_<t``;
* ``PTPRequest(j, t)``: ``x_<j`` (offset row 0, positions ``0..j-1``) followed by
  ``x_{j+1}, ..., x_t`` at their own positions ``j+1..t`` with offset rows ``1..t-j`` (offsets
  ``-1..-(t-j)``, eq. 8 with ``l = t - j``); the logits at ``x_t`` give ``p(x_j | x_<j, x_{j+1..t})``.

The proposal rules and the position-keyed draws (:class:`~rpt.sampling.proposals.Proposer`) are
the fast decoder's, so with the same row seeds both emit the same tokens.
"""

from __future__ import annotations

import time

import torch

from rpt.sampling.algorithm import NTPRequest, Plan, Row, decode_row
from rpt.sampling.config import SamplingConfig
from rpt.sampling.decode.inputs import prepare_decode
from rpt.sampling.output import GenerateOutput, assemble
from rpt.sampling.proposals import Proposer, nonfinite, raise_nonfinite
from rpt.sampling.text.healing import TokenHealingLogitsProcessor


class _UncachedAnswers:
    """Answers one row's requests, one uncached model call each."""

    def __init__(self, model, row: Row, proposer: Proposer, device: torch.device):
        self.model, self.row, self.proposer, self.device = model, row, proposer, device
        self.calls = 0

    def _ids(self, values: list[int]) -> torch.Tensor:
        return torch.tensor([values], dtype=torch.long, device=self.device)

    def _last_logits(self, ids: list[int], **kwargs) -> torch.Tensor:
        self.calls += 1
        logits = self.model(self._ids(ids), use_cache=False, **kwargs).logits[:, -1]
        raise_nonfinite(nonfinite(logits).nonzero()[:, 0].tolist())
        return logits

    def ntp(self, req: NTPRequest) -> int:
        x = self.row.tokens[: req.t]
        draws = self.proposer.ntp(self._ids(x), self._last_logits(x), req.t)
        return int(draws[0, min(req.it, draws.shape[1] - 1)])

    def ptp(self, req) -> tuple[int, bool]:
        x, j, t = self.row.tokens, req.j, req.t
        logits = self._last_logits(
            x[:j] + x[j + 1: t + 1], position_ids=self._ids(list(range(j)) + list(range(j + 1, t + 1))),
            offset_ids=self._ids([0] * j + list(range(1, t - j + 1))),
        )
        tokens, accepted = self.proposer.ptp(self._ids(x[:j]), logits, t, req.it, req.lag)
        return int(tokens[0]), bool(accepted[0])

    def __call__(self, requests: list) -> list:
        return [self.ntp(r) if isinstance(r, NTPRequest) else self.ptp(r) for r in requests]


def _decode(model, row: Row, plan: Plan, proposer: Proposer, device: torch.device) -> int:
    """Run one row's program to the end; returns the model calls it took."""
    answer = _UncachedAnswers(model, row, proposer, device)
    program = decode_row(row, plan)
    try:
        requests = next(program)
        while True:
            requests = program.send(answer(requests))
    except StopIteration:
        return answer.calls


@torch.no_grad()
def generate_reference(model, input_ids: torch.Tensor, config: SamplingConfig, attention_mask: torch.Tensor | None = None,
                       *, tokenizer=None, streamer=None, row_seeds: list[int] | None = None) -> GenerateOutput:
    """Sample continuations of left-padded ``input_ids`` with RPT, recomputing everything (the oracle).

    Same contract as :func:`rpt.sampling.decode.generate.generate` (``tokenizer`` is needed for stop
    strings and token healing; ``streamer`` receives tokens of a single prompt once they are final;
    ``row_seeds`` keys each row's draws, default ``row_seed(config.seed, b)``, a hash).
    """
    start = time.perf_counter()
    inputs = prepare_decode(model, config, input_ids, attention_mask, tokenizer, streamer, row_seeds)
    config, prompts, plan, seeds = inputs.config, inputs.prompts, inputs.plan, inputs.seeds
    device = input_ids.device
    calls = corrections = 0
    generated, reasons = [], []
    for b, (prompt, prefix) in enumerate(zip(prompts.rows, prompts.prefixes)):
        healing = TokenHealingLogitsProcessor(prompts.vocab, [prefix], len(prompt)) if prefix else None
        proposer = Proposer(config, len(prompt), torch.tensor([seeds[b]], device=device), healing=healing)
        row = Row(prompt, prefix, prompts.vocab, streamer, stream_lag=config.rpt_window - 1 if plan.k else 0,
                  max_new=inputs.budgets[b])
        calls += _decode(model, row, plan, proposer, device)
        generated.append(row.generated)
        reasons.append(row.reason)
        corrections += row.corrections
    stats = {"forward_passes": calls, "corrections": corrections}
    return assemble(input_ids, prompts, generated, reasons, inputs.pad_id, stats, start,
                    healed=config.token_healing, seeds=seeds)

