r"""The event check of RPT's batch-flat common step, shared by the eager step
(:mod:`rpt.sampling.decode.rpt_path`) and the compiled one (:mod:`rpt.sampling.decode.compiled_rpt`).

An *event* is what hands a row back to the per-row driver: its sweep accepts a proposal that differs
from the current token (a correction), or the settled ``x_m`` is its last token (an EOS id, or the
last column of its budget).

Everything here is ``[batch]`` pointwise work on the call's unpacked proposals
(:class:`~rpt.sampling.proposals.CallProposals`), ORed lag by lag in Python: no small reduction over
a lag axis and no round trip through the packed columns, the shape inductor's CUDA scheduler handles
at every batch size (the NTP step's).
"""

from __future__ import annotations

import torch

from rpt.sampling.proposals import CallProposals


def lag_validity(s, m, lags: tuple[int, ...]) -> list[torch.Tensor] | None:
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


def settle_flags(s, props: CallProposals, lags: tuple[int, ...], x_m: torch.Tensor, m,
                 valid: list[torch.Tensor] | None) -> torch.Tensor:
    """Set ``s.bad`` (``[batch]``: live rows whose logits held NaN / inf, accumulated over the steps since
    the flags were last read, as NTP's) and ``s.flags`` (any bad row; any live row with an event: an
    accepted correction, or ``x_m`` is its last token, EOS or its budget), in place; return the event
    flag (0-dim bool). The event flag is sticky too: a step after one that stopped (and so committed
    nothing) repeats its column, and must not commit either. ``s``: the
    :class:`~rpt.sampling.decode.state.DecodeState`."""
    event = s.ends_at(x_m, m)
    sweep = events(s.seqs, props, lags, m, valid)
    if sweep is not None:
        event = event | sweep
    s.bad |= props.bad & s.alive
    stop = s.flags[1] | (event & s.alive).any()
    s.flags.copy_(torch.stack([s.bad.any(), stop]))
    return stop
