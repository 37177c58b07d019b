r"""The batch-flat common step of RPT (``rpt_iters >= 1``): host work that does not grow with the batch
while nothing happens. Greedy (``temperature == 0``, any k) and sampled with one iteration (k = 1).

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

Here that step is a fixed run of tensor operations around the call the per-row driver would make
(the same query block, the same :class:`~rpt.sampling.proposals.Proposer` and keys, so the same
tokens), with one device-to-host transfer: whether any row's logits are NaN / inf, and whether any
live row has an *event* -- an accepted correction, an EOS (in the settled ``x_m``), or its last
position.

At an event the step is handed back unfinished: every live row gets a fresh program resumed at
position ``m`` (:func:`~rpt.sampling.algorithm.decode_row` with ``start``), the driver's view of the
cache (through ``m - 1``) and the proposals for ``m``, and the driver runs position ``m`` per row,
reusing the call just made (:meth:`~rpt.sampling.decode.driver.Decoder.hand_over`), so an event costs
no extra call. The driver hands over again once every live row has settled a column. Stop strings,
token healing and a streamer stay with the per-row driver.
"""

from __future__ import annotations

import torch

from rpt.sampling.decode.compile_mode import steps_per_read
from rpt.sampling.proposals import raise_nonfinite


def eligible(decoder) -> bool:
    """Whether ``decoder``'s decode is RPT with a common step this module covers (greedy, or sampled
    with one iteration) and nothing that needs per-row Python every step."""
    plan = decoder.plan
    return (plan.k >= 1 and plan.w >= 2 and (plan.deterministic or plan.k == 1) and not decoder.config.stop
            and not any(decoder.prompts.prefixes) and decoder.streamer is None)


def run(d, n: int) -> int:
    """Common steps from the driver's state at column n (every live row has settled n and knows its
    proposals for n + 1) until an event; returns the column the per-row driver goes on settling.

    The rows' state lives in ``d.state`` (:class:`~rpt.sampling.decode.state.DecodeState`): which rows
    are live, their proposals for the step's column, the step's column, the layout; each step
    (:meth:`~rpt.sampling.decode.driver.Decoder.common_step`) updates it in place. Compiled, several
    steps run between two reads of the flags (:func:`~rpt.sampling.decode.compile_mode.steps_per_read`): a
    step that hits an event commits nothing, so those queued after it repeat its column, and the
    event's column is read from the state."""
    s = d.state
    nobody_goes_on = d.flat_start(n)
    m = n + 1
    # at the first position (no window yet) the per-row driver makes no call when every live row ends
    # there with its proposal, so neither may this
    if m == d.W and nobody_goes_on:
        s.write_column(m, torch.where(s.alive, s.draws[:, 0], s.column(m)))
        d.hand_over(m)
        return m
    most = steps_per_read(d.device) if d.compile_backend is not None else 1
    while True:
        # the queue's depth halves at each event and doubles after each read without one (up to
        # `most`): rare events cost few reads, frequent ones (corrections) few steps queued past them
        steps = min(d.queue_depth, most, d.last - m + 1)  # every live row stops at the last column at the latest
        for i in range(steps):
            block = d.common_step(m + i)
        bad, stop = s.flags.tolist()  # the one transfer of the steps since the last
        if bad:
            raise_nonfinite(s.bad.nonzero()[:, 0].tolist())
        if stop:
            event = int(s.n) if steps > 1 else m  # the event's column (a second read, at events only)
            d.steps_past_events += m + steps - 1 - event  # queued after it: they repeated its column
            d.queue_depth = max(1, steps // 2)
            d.hand_over(event, block)
            return event
        m += steps
        d.queue_depth = min(2 * d.queue_depth, most)
