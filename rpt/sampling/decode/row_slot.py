r"""``Slot``: the per-row driver's view of one row -- its program, which tokens the KV cache holds for
it, and which proposals it may still reuse.

The cache is addressed by column and rewritten in place (:mod:`rpt.decode_forward.kv_cache`), so the driver
(:class:`~rpt.sampling.decode.driver.Decoder`) keeps no rollback: a slot remembers the token whose KV sits
at each column, and the cache serves the row up to its first column whose token changed since,
whatever changed it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rpt.sampling.algorithm import Plan, Program, Request, Row, decode_row


@dataclass
class Slot:
    """The driver's view of one row: its program, what the cache holds for it, proposals it may reuse.

    ``kv[c]`` is the token whose NTP KV sits at cache column c (computed over the tokens ``kv`` holds
    before c); the cache serves the row through column c while ``kv`` equals its tokens up to c.
    ``draws[c]`` are NTP proposals for column c (one per RPT iteration) from the logits at c - 1 over
    that cache state: usable while it serves the row through c - 1.
    """

    index: int
    row: Row
    program: Program
    pad: int
    pad_id: int
    kv: list[int | None]
    requests: list[Request] | None = None  # what the program waits for; None once it has finished
    draws: dict[int, list[int]] = field(default_factory=dict)
    low: int = 0  # columns below it are served (they precede every window still open)
    feed: dict[int, int] = field(default_factory=dict)  # this call's tokens to feed in place of the row's

    def token(self, c: int) -> int:
        """The row's token at column c (the pad id left of the prompt and after a finished row's end)."""
        p = c - self.pad
        return self.row.tokens[p] if 0 <= p < len(self.row.tokens) else self.pad_id

    def served_upto(self, n: int) -> int:
        """The first column (<= n + 1) whose cached KV is not the current token's."""
        lo, tokens = max(self.low, self.pad), self.row.tokens
        hi = min(n + 1, self.pad + len(tokens))  # columns holding the row's tokens; pad ids after them
        if hi > lo:
            cached, current = self.kv[lo:hi], tokens[lo - self.pad: hi - self.pad]
            if cached != current:  # one C-level list comparison on the common path: all served
                return lo + next(i for i, (a, b) in enumerate(zip(cached, current)) if a != b)
        for c in range(max(lo, hi), n + 1):
            if self.kv[c] != self.pad_id:
                return c
        return n + 1

    def usable(self, c: int, n: int) -> list[int] | None:
        draws = self.draws.get(c)
        return draws if draws is not None and self.served_upto(min(c - 1, n)) >= c else None

    def resume(self, tokens: list[int], m: int, plan: Plan, draws: list[int]) -> None:
        """Take the row back from the batch-flat path at column m: its ``tokens`` (the layout's columns
        before m), a program resumed at position ``m - pad``, the cache through column m - 1, and its
        proposals ``draws`` for m."""
        row = self.row
        row.tokens = tokens[self.pad:]
        row.take_dirty()
        self.program = decode_row(row, plan, start=m - self.pad)
        self.requests = next(self.program)
        self.kv[self.low: m] = tokens[self.low: m]
        self.kv[m:] = [None] * (len(self.kv) - m)
        self.low = max(self.low, m - 1 - plan.w)
        self.draws = {m: draws}
