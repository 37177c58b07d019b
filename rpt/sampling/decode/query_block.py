r"""The query block of one decoder call at column n, the same for every row: which queries it feeds
(the NTP region, then one PTP chain per lag), the columns each reads and writes, which logits it
keeps, and the device tensors of that pattern.

The per-row driver (:class:`~rpt.sampling.decode.driver.Decoder`) plans one :class:`Block` per round and
the batch-flat RPT path one per common step (:mod:`rpt.sampling.decode.rpt_path`); a :class:`Pattern` is
the block as tensors, cached in the decode state, and a :class:`MadeCall` a call the batch-flat path
made before it handed the rows back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from rpt.sampling.decode.proposal_layout import ProposalLayout


class Query(NamedTuple):
    """One query of a block, its columns relative to the call's column n."""

    source: int  # the sequence column whose token it feeds
    write: int  # the cache column its KV is written to
    limit: int  # the last sequence column it sees
    since: int  # the first column of its chain (its own column for an NTP query)
    offset: int  # its offset row: 0 NTP, l for the l-th token of a PTP chain


@dataclass(frozen=True)
class Block:
    """The query block of one call, relative to column n (the same for every row)."""

    region: int  # R: NTP queries at columns n-R+1 .. n
    lags: tuple[int, ...]  # one PTP chain per lag, after the region
    keep_top: bool  # logits at column n (NTP for x_{n+1})
    keep_prev: bool  # logits at column n - 1 (NTP re-proposal of x_n)

    def rows(self) -> list[Query]:
        """The block's queries, in order: the NTP region, then each chain."""
        out = [Query(*(q - self.region + 1,) * 4, offset=0) for q in range(self.region)]
        for lag in self.lags:
            first = len(out) - self.region + 1
            for m in range(lag):  # x_{j+1+m}, j = n - lag, in the next scratch column
                out.append(Query(m - lag + 1, first + m, -lag - 1, first, m + 1))
        return out

    def covers(self, other: Block) -> bool:
        """Whether this block's call answers everything ``other``'s would: the same NTP queries (and the
        logits at n wherever ``other`` keeps them), a chain for each of its lags."""
        return (self.region == other.region and self.keep_prev == other.keep_prev
                and self.keep_top >= other.keep_top and set(other.lags) <= set(self.lags))

    def keep(self) -> list[int]:
        """Query indices whose logits are needed, in slot order: top, prev, then each chain's last."""
        keep = ([self.region - 1] if self.keep_top else []) + ([self.region - 2] if self.keep_prev else [])
        start = self.region
        for lag in self.lags:
            start += lag
            keep.append(start - 1)
        return keep


@dataclass(frozen=True)
class MadeCall:
    """A call the batch-flat path (:mod:`rpt.sampling.decode.rpt_path`) made at column n before it handed the
    rows back: the per-row round at n, which needs this very call, reuses it."""

    n: int
    block: Block
    vals: list[list[int]]  # its proposals, per row, in the block's ProposalLayout (read with the hand-over)


class Pattern:
    """Device tensors of one block pattern (cached in the decode state: a decode uses a handful), and
    the layout of its proposals (``draws`` NTP draws per query). ``static``: the tensors' addresses are
    marked static (a pooled state's, read by graph-replayed steps)."""

    def __init__(self, block: Block, device: torch.device, draws: int, static: bool = False):
        table = torch.tensor(block.rows(), dtype=torch.long, device=device).reshape(-1, len(Query._fields))
        self.src, self.write, self.limit, self.since, offsets = (c.contiguous() for c in table.unbind(1))
        self.offsets = offsets if block.lags else None
        keep = block.keep()
        q = table.shape[0]
        self.keep: int | torch.Tensor = len(keep) if keep == list(range(q - len(keep), q)) else \
            torch.tensor(keep, dtype=torch.long, device=device)
        self.scratch = q - block.region
        self.layout = ProposalLayout(draws, block.keep_top, block.keep_prev, block.lags)
        if static:  # every tensor a graph-replayed step reads keeps one address (no copy per replay)
            for t in (self.src, self.write, self.limit, self.since, self.offsets, self.keep):
                if isinstance(t, torch.Tensor):
                    torch._dynamo.mark_static_address(t)
