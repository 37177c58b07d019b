r"""``generate_reference``: the RPT sampler written as plainly as possible, the test oracle.

No KV cache, one row at a time, every conditional recomputed from scratch. For each new position t
(0-based columns, prompt ``x_{<P}``):

1. NTP: ``x_t`` from ``p(x_t | x_{<t})`` (one model call on ``x_{<t}``).
2. Up to ``k = rpt_iters`` iterations over the window: for ``j = max(t-w+1, P), ..., t-1`` (oldest
   first) one model call on ``x_{<j}`` (offset row 0, positions ``0..j-1``) followed by
   ``x_{j+1}, ..., x_t`` at their own positions ``j+1..t`` with offset rows ``1..t-j`` (offsets
   ``-1..-(t-j)``, eq. 8 with ``l = t - j``); the logits at ``x_t`` give ``p(x_j | x_{<j},
   x_{j+1..t})``, whose proposal replaces ``x_j`` when accepted (``common.Proposer``). If the sweep
   changed a token, ``x_t`` is re-proposed by NTP on the updated prefix. If it changed nothing and
   PTP proposals are greedy, every further iteration would repeat it exactly: stop early.
   (Nothing changed means the prefix of ``x_t`` is unchanged, so ``x_t`` keeps the draw it has from
   that very conditional; it is re-proposed only after a change.)
3. The row stops on EOS or a stop string (``stopping.StopChecker``) once position t has settled.
"""

from __future__ import annotations

import time

import torch

from rpt.model import RPTForCausalLM
from rpt.sampling.common import (
    FrozenStream,
    GenerateOutput,
    HealingFrontier,
    Proposer,
    assemble,
    check_model,
    check_streamer,
    effective_max_new_tokens,
    make_generator,
    pad_token_id,
    prepare_prompts,
)
from rpt.sampling.config import SamplingConfig
from rpt.sampling.healing import TokenHealingLogitsProcessor
from rpt.sampling.stopping import StopChecker


class _Row:
    """One prompt's decode, with the model calls counted."""

    def __init__(self, model, device: torch.device):
        self.model, self.device, self.calls = model, device, 0

    def _ids(self, tokens: list[int]) -> torch.Tensor:
        return torch.tensor([tokens], dtype=torch.long, device=self.device)

    def ntp_logits(self, x: list[int], t: int) -> torch.Tensor:
        """Logits of ``p(x_t | x_{<t})``: the plain causal LM on ``x_{<t}``."""
        self.calls += 1
        return self.model(self._ids(x[:t]), use_cache=False).logits[:, -1]

    def ptp_logits(self, x: list[int], j: int, t: int) -> torch.Tensor:
        """Logits of ``p(x_j | x_{<j}, x_{j+1..t})``: ``x_j`` left out, later tokens at their own positions."""
        self.calls += 1
        ids = x[:j] + x[j + 1: t + 1]
        positions = list(range(j)) + list(range(j + 1, t + 1))
        rows = [0] * j + list(range(1, t - j + 1))
        out = self.model(self._ids(ids), position_ids=self._ids(positions), offset_ids=self._ids(rows), use_cache=False)
        return out.logits[:, -1]


def _decode_row(model, prompt: list[int], prefix: bytes, vocab, config: SamplingConfig, max_new: int,
                stopper: StopChecker, generator, device, streamer) -> tuple[list[int], str, int, int]:
    """One prompt: ``(generated tokens, finish reason, model calls, corrections)``."""
    k, w, P = config.rpt_iters, config.rpt_window, len(prompt)
    healing = TokenHealingLogitsProcessor(vocab, [prefix], P) if prefix else None
    proposer = Proposer(config, P, healing=healing, generator=generator)
    frontier = HealingFrontier(vocab, prefix)
    row, x, reason, corrections = _Row(model, device), list(prompt), "length", 0
    stream = FrozenStream(streamer, prompt, config)
    if not isinstance(model, RPTForCausalLM):
        k = 0

    def ntp(t: int) -> int:
        return int(proposer.ntp(row._ids(x[:t]), row.ntp_logits(x, t))[0])

    for t in range(P, P + max_new):
        x.append(ntp(t))
        lo = max(t - w + 1, P + frontier.first_revisable(t - P))
        for _ in range(k if lo < t else 0):
            changed = False
            for j in range(lo, t):
                tokens, accepted = proposer.ptp(row._ids(x[:j]), row.ptp_logits(x, j, t))
                tok = int(tokens[0, 0])
                if bool(accepted[0, 0]) and tok != x[j]:
                    x[j], changed = tok, True
                    corrections += 1
            if changed:
                x[t] = ntp(t)
            elif proposer.ptp_samples_greedy:
                break
        frontier.update(x[P:])
        why, keep = stopper.check(x[P:])
        if why is not None:
            del x[P + keep:]
            reason = why
            break
        stream.update(x[P:])
    stream.end(x[P:])
    return x[P:], reason, row.calls, corrections


@torch.no_grad()
def generate_reference(model, input_ids: torch.Tensor, config: SamplingConfig, attention_mask: torch.Tensor | None = None,
                       *, tokenizer=None, streamer=None) -> GenerateOutput:
    """Sample continuations of left-padded ``input_ids`` with RPT, recomputing everything (the oracle).

    Same contract as :func:`rpt.sampling.rpt.generate` (``tokenizer`` is needed for stop strings and
    token healing; ``streamer`` receives tokens of a single prompt once they are final).
    """
    start = time.perf_counter()
    config.validate()
    check_model(model, config)
    stopper = StopChecker(config.eos_token_ids, config.stop, tokenizer, window=config.rpt_window)
    prompts = prepare_prompts(input_ids, attention_mask, config, tokenizer)
    check_streamer(streamer, len(prompts.rows))
    max_new = effective_max_new_tokens(model, prompts, config)
    generator = make_generator(config, input_ids.device)
    calls = corrections = 0
    generated, reasons = [], []
    for prompt, prefix in zip(prompts.rows, prompts.prefixes):
        gen, reason, c, fixes = _decode_row(model, prompt, prefix, prompts.vocab, config, max_new, stopper, generator,
                                            input_ids.device, streamer)
        generated.append(gen)
        reasons.append(reason)
        calls, corrections = calls + c, corrections + fixes
    stats = {"forward_passes": calls, "corrections": corrections}
    return assemble(input_ids, prompts, generated, reasons, pad_token_id(model, config), stats, start,
                    healed=config.token_healing)
