r"""The batch-flat common step of greedy RPT (``rpt_iters >= 1``, ``temperature == 0``): host work that
does not grow with the batch while nothing happens.

The per-row driver (:mod:`rpt.sampling.fast_decoder`) resumes every row's program
(:func:`rpt.sampling.algorithm.decode_row`) at every step: tens of microseconds of Python per row.
In a greedy decode the common step is the same for every row: the NTP proposal ``x_m`` (known from
the previous call) is appended, the sweep over the window finds no accepted proposal that differs
from the current token, so the iterations end (greedy: a repeat would change nothing), the position
settles without a stop, and the next proposal is the argmax at ``m``. Here that step is a fixed run
of tensor operations around the call the per-row driver would make (the same query block, the same
:class:`~rpt.sampling.proposals.Proposer`, so the same tokens), with one device-to-host transfer:
whether any row's logits are NaN / inf, and whether any live row has an *event* -- an accepted
correction, an EOS, or its last position.

At an event the step is handed back unfinished: every live row gets a fresh program resumed at
position ``m`` (:func:`~rpt.sampling.algorithm.decode_row` with ``start``), the driver's view of the
cache (through ``m - 1``) and the proposal for ``m``, and the driver runs position ``m`` per row,
reusing the call just made (:attr:`_Decoder.pending`), so an event costs no extra call. The driver
hands over again once every live row has settled a column. Stop strings, token healing, a streamer
and sampling (temperature > 0) stay with the per-row driver.
"""

from __future__ import annotations

import torch

from rpt.sampling.algorithm import decode_row
from rpt.sampling.proposals import raise_nonfinite


def eligible(decoder) -> bool:
    """Whether ``decoder``'s decode is greedy RPT with nothing that needs per-row Python every step."""
    return (decoder.plan.k >= 1 and decoder.plan.w >= 2 and decoder.plan.deterministic and not decoder.config.stop
            and not any(decoder.prompts.prefixes) and decoder.streamer is None)


def _events(d, vals: torch.Tensor, lags: tuple[int, ...], top: int, m: int) -> torch.Tensor:
    """``[batch]`` bool: rows whose sweep at column m accepts a proposal that differs from the token."""
    event = torch.zeros_like(vals[:, 0], dtype=torch.bool)
    for i, lag in enumerate(lags):  # vals: nonfinite, the NTP proposal if top, then (token, accepted) per lag
        token, accepted = vals[:, 1 + top + 2 * i], vals[:, 2 + top + 2 * i]
        event |= accepted.bool() & (token != d.seqs[:, m - lag])
    return event


def run(d, n: int) -> int:
    """Common steps from the driver's state at column n (every live row has settled n and knows its
    proposal for n + 1) until an event; returns the column the per-row driver goes on settling."""
    alive = torch.tensor([s.requests is not None for s in d.slots], device=d.device)
    proposal = d._to_device([s.usable(n + 1, n)[0] if s.requests is not None else d.pad_id for s in d.slots])
    last, eos = d.last_cols, d.eos  # each row's last position's column; the EOS ids
    d._apply_writes()
    m = n + 1
    while True:
        d.seqs[:, m] = torch.where(alive, proposal, d.seqs[:, m])
        ends = (last <= m) | torch.isin(proposal, eos)  # x_m is the row's last token (if no sweep changes it)
        # no window yet (the first position) and every row ends at m: the per-row driver makes no call
        # here, so neither may this (a host read, at the first position only)
        if m == d.W and not bool((alive & ~ends).any()):
            _hand_over(d, proposal, m)
            return m
        block, vals = d.call_block(m)
        top = int(block.keep_top)
        event = _events(d, vals, block.lags, top, m) | ends
        bad, stop = torch.stack([(vals[:, 0].bool() & alive).any(), (event & alive).any()]).tolist()  # one transfer
        if bad:
            raise_nonfinite([b for b, v in enumerate(vals[:, 0].tolist()) if v and d.slots[b].requests is not None])
        if stop:
            _hand_over(d, proposal, m)
            d.pending = (m, block, vals)
            return m
        proposal = vals[:, 1]
        m += 1


def _hand_over(d, proposal: torch.Tensor, m: int) -> None:
    """Give every live row back to the per-row driver at position ``m - pad`` (its tokens, a program
    resumed there, the cache it has through column m - 1, its proposal for m)."""
    seqs, proposal = d.seqs[:, :m].tolist(), proposal.tolist()
    for s in d.slots:
        if s.requests is None:
            continue
        row, tokens = s.row, seqs[s.index]
        row.tokens = tokens[s.pad:]
        row.take_dirty()
        s.program = decode_row(row, d.plan, start=m - s.pad)
        s.requests = next(s.program)
        s.kv[s.low: m] = tokens[s.low: m]
        s.kv[m:] = [None] * (len(s.kv) - m)
        s.low = max(s.low, m - 1 - d.plan.w)
        s.draws = {m: [proposal[s.index]]}
