r"""The batch-flat NTP path of ``generate`` (``rpt_iters == 0``): host work that does not grow with
the batch.

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
"""

from __future__ import annotations

import torch

from rpt.sampling.decode.compile_mode import STEPS_PER_TRANSFER, steps_per_read  # noqa: F401 -- the table, also here
from rpt.sampling.decode.compiled_ntp import settle
from rpt.sampling.output import GenerateOutput, assemble
from rpt.sampling.proposals import nonfinite, raise_nonfinite


def eligible(decoder) -> bool:
    """Whether ``decoder``'s decode is plain NTP with nothing that needs per-row Python."""
    return (decoder.plan.k == 0 and not decoder.config.stop and not any(decoder.prompts.prefixes)
            and decoder.streamer is None)


def _eager_step(d, logits: torch.Tensor, n: int) -> None:
    """Propose every row's token for column n + 1 from its logits ``[batch, V]`` at n, into the state
    (as the compiled step does, on the growing context ``seqs[:, : n + 1]``)."""
    s = d.state
    s.bad |= nonfinite(logits) & ~s.done  # a finished row's logits (of its pad id) are never used
    token = d.proposer.ntp(s.seqs[:, : n + 1], logits, n + 1 - s.pads)[:, 0]
    settle(s, token, n)


def run(d) -> GenerateOutput:
    """Decode every row of the :class:`~rpt.sampling.decode.driver.Decoder` ``d`` to its end."""
    s, W = d.state, d.W
    n = W - 1
    # the prefill (the prompts' columns) and its proposals run eagerly; with compile, every later step
    # (model call, processors, proposal) is one compiled function over fixed shapes
    logits = d.ntp_logits(W, n)[:, 0]
    step = d.compiled_ntp_step(logits)
    _eager_step(d, logits, n)
    n += 1
    s.n.fill_(n)
    per_read = steps_per_read(d.device) if step is not None else 1
    while True:
        error, finished = s.flags.tolist()  # the one transfer of the steps since the last
        if error:
            raise_nonfinite(s.bad.nonzero()[:, 0].tolist())
        if finished:
            break
        if step is None:
            _eager_step(d, d.ntp_logits(1, n)[:, 0], n)
            n += 1
            continue
        steps = min(per_read, d.last - n)  # never past the last column a row may write
        for _ in range(steps):
            step(s, d.traced, d.queries)
        n += steps
    counts = (s.end[: s.rows] - W + 1).tolist()  # the decode's rows (a batch bucket's inert ones aside)
    rows = s.seqs[: s.rows, W: W + max(counts)].tolist()
    generated = [row[:c] for row, c in zip(rows, counts)]
    eos_ids = set(d.config.eos_token_ids)
    reasons = ["eos" if g and g[-1] in eos_ids else "length" for g in generated]
    stats = {"forward_passes": d.queries.calls, "corrections": 0}
    return assemble(d.input_ids, d.prompts, generated, reasons, d.pad_id, stats, d.start,
                    healed=d.config.token_healing, seeds=d.seeds)
