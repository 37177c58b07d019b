r"""The column layout of a decoder call's proposals: one ``[batch, width]`` int64 tensor per call, so
that the device hands every proposal and acceptance of the call to the host in one transfer.

:func:`~rpt.sampling.proposals.block_proposals` writes it; the per-row driver
(:mod:`rpt.sampling.decode.driver`) and the batch-flat common step with its event check, eager and
compiled (:mod:`rpt.sampling.decode.rpt_path`), read it, all through the named columns here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch


@dataclass(frozen=True)
class ProposalLayout:
    """Columns, in order: whether the row's logits hold NaN / inf (:attr:`flag`); with ``keep_top`` the
    ``draws`` NTP draws for column n + 1 (:attr:`top`); with ``keep_prev`` those for column n
    (:attr:`prev`); per lag, the PTP ``(token, accepted)`` pair for ``x_{n-lag}`` (:attr:`chains`)."""

    draws: int  # NTP draws per query: one per RPT iteration (Proposer.ntp_draws)
    keep_top: bool
    keep_prev: bool
    lags: tuple[int, ...]

    flag: ClassVar[int] = 0

    @property
    def top(self) -> slice:
        """The NTP draws for column n + 1 (empty without ``keep_top``)."""
        return slice(1, 1 + self.draws * self.keep_top)

    @property
    def prev(self) -> slice:
        """The NTP draws for column n (empty without ``keep_prev``)."""
        return slice(self.top.stop, self.top.stop + self.draws * self.keep_prev)

    @property
    def chains(self) -> slice:
        """The PTP pairs, ``(token, accepted)`` per lag in ``lags`` order."""
        return slice(self.prev.stop, self.prev.stop + 2 * len(self.lags))

    @property
    def width(self) -> int:
        return self.chains.stop

    def chain_columns(self, vals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens, accepted)`` of ``vals`` ``[batch, width]``, each ``[batch, lags]`` (accepted bool)."""
        pairs = vals[:, self.chains].reshape(-1, len(self.lags), 2)
        return pairs[..., 0], pairs[..., 1].bool()

    def answers(self, row: list[int]) -> dict[int, tuple[int, bool]]:
        """One row of ``vals`` on the host: its ``(token, accepted)`` per lag."""
        pairs = row[self.chains]
        return {lag: (pairs[2 * i], bool(pairs[2 * i + 1])) for i, lag in enumerate(self.lags)}
