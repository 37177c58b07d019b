r"""The event check of RPT's batch-flat common step, shared by the eager step
(:mod:`rpt.sampling.rpt_path`) and the compiled one (:mod:`rpt.sampling.compiled_rpt`).

An *event* is what hands a row back to the per-row driver: its sweep accepts a proposal that differs
from the current token (a correction), or the settled ``x_m`` is its last token (an EOS id, or the
last column of its budget).
"""

from __future__ import annotations

import torch

from rpt.sampling.proposal_layout import ProposalLayout


def events(seqs: torch.Tensor, vals: torch.Tensor, layout: ProposalLayout, m) -> torch.Tensor:
    """``[batch]`` bool: rows whose sweep at column m (an int or a 0-dim tensor) accepts a proposal that
    differs from the token. ``vals``: the call's proposals, in ``layout``'s columns."""
    lags = layout.lags
    if not lags:
        return torch.zeros_like(vals[:, layout.flag], dtype=torch.bool)
    # the common step's lags are 1 .. L: an arange, not a tensor of the tuple (a host-to-device copy)
    assert lags == tuple(range(1, len(lags) + 1)), lags
    current = seqs.index_select(1, m - torch.arange(1, len(lags) + 1, device=seqs.device))  # x_{m-l} per lag
    tokens, accepted = layout.chain_columns(vals)
    return (accepted & (tokens != current)).any(1)


def step_flags(s, seqs: torch.Tensor, vals: torch.Tensor, layout: ProposalLayout, x_m: torch.Tensor,
               alive: torch.Tensor, m) -> torch.Tensor:
    """``[2]``: whether any live row's logits were NaN / inf, and whether any live row has an event (an
    accepted correction, or ``x_m`` is its last token: EOS or its budget), for the step's one transfer.
    ``s``: the :class:`~rpt.sampling.decode_state.DecodeState` (its rows' budgets and EOS ids)."""
    event = events(seqs, vals, layout, m) | s.ends_at(x_m, m)
    return torch.stack([(vals[:, layout.flag].bool() & alive).any(), (event & alive).any()])
