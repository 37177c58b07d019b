r"""The batch-flat NTP path of ``generate`` (``rpt_iters == 0``): host work that does not grow with
the batch.

The per-row driver (:mod:`rpt.sampling.fast_decoder`) resumes every row's program
(:func:`rpt.sampling.algorithm.decode_row`) each step, tens of microseconds of Python per row. For
plain NTP sampling the program is one proposal per position and a stop check, so here the decode
state of all rows lives in device tensors (tokens, each row's last column, which rows are done)
and a step is a fixed run of tensor operations around one model call: propose (the same
:class:`~rpt.sampling.proposals.Proposer`, the same position-keyed draws), write the token, mark
rows that produced an EOS or reached their budget, and one device-to-host transfer (NaN logits
and whether every row is done). A finished row is fed its pad id until the others finish, as in
Hugging Face ``generate``.

It covers what needs no per-row Python: no stop strings (they decode text), no token healing
(a per-row frontier), no streamer. The per-row driver runs everything else, and this path is tested
against :func:`~rpt.sampling.reference.generate_reference` as that one is.
"""

from __future__ import annotations

import torch

from rpt.sampling.compiled_ntp import CompiledNTPStep, settle
from rpt.sampling.output import GenerateOutput, assemble
from rpt.sampling.proposals import nonfinite, raise_nonfinite


def eligible(decoder) -> bool:
    """Whether ``decoder``'s decode is plain NTP with nothing that needs per-row Python."""
    return (decoder.plan.k == 0 and not decoder.config.stop and not any(decoder.prompts.prefixes)
            and decoder.streamer is None)


def _eager_step(d, logits: torch.Tensor, n: int, done: torch.Tensor, end: torch.Tensor):
    """Propose every row's token for column n + 1 from its logits at n (as the compiled step does)."""
    bad = nonfinite(logits) & ~done  # a finished row's logits (of its pad id) are never used
    token = d.proposer.ntp(d.seqs[:, : n + 1], logits[:, 0], n + 1 - d.pads)[:, 0]
    token, done, end = settle(d, token, n, done, end)
    return token, done, end, bad, torch.stack([bad.any(), done.all()])


def run(d) -> GenerateOutput:
    """Decode every row of the :class:`~rpt.sampling.fast_decoder.Decoder` ``d`` to its end."""
    W, batch = d.W, len(d.prompts.rows)
    end = d.last_cols.clone()  # the column of each row's final token, once it is done
    done = torch.zeros(batch, dtype=torch.bool, device=d.device)
    n = W - 1
    # the prefill (the prompts' columns) and its proposals run eagerly; with compile, every later step
    # (model call, processors, proposal) is one compiled function over fixed shapes
    logits = d.ntp_logits(W, n)
    step = CompiledNTPStep(d, d.compile_backend, logits[:, 0]) if d.compile_backend else None
    token, done, end, bad, flags = _eager_step(d, logits, n, done, end)
    while True:
        d.seqs[:, n + 1] = token
        n += 1
        error, finished = flags.tolist()  # the step's one transfer
        if error:
            raise_nonfinite(bad.nonzero()[:, 0].tolist())
        if finished:
            break
        if step is not None:
            token, done, end, bad, flags = step(n, done, end)
        else:
            token, done, end, bad, flags = _eager_step(d, d.ntp_logits(1, n), n, done, end)
    counts = (end - W + 1).tolist()
    rows = d.seqs[:, W: W + max(counts)].tolist()
    generated = [row[:c] for row, c in zip(rows, counts)]
    eos_ids = set(d.config.eos_token_ids)
    reasons = ["eos" if g and g[-1] in eos_ids else "length" for g in generated]
    stats = {"forward_passes": d.queries.calls, "corrections": 0}
    return assemble(d.input_ids, d.prompts, generated, reasons, d.pad_id, stats, d.start,
                    healed=d.config.token_healing, seeds=d.seeds)
