"""The LZ state of a persistent batch whose rows come, go and move (vLLM's V1 logits processors).

Each LZ row keeps its last ``W`` context tokens and their match lengths in device tensors
(right-aligned, -1 gaps), one ``[max_rows, W]`` pair per distinct setting, indexed by batch row.
Every step each row gains the token the engine appended to its output list:
:func:`rpt.sampling.lz.append_token` updates the row on the device in O(W) (the recurrence of
:class:`~rpt.sampling.lz.LZMatchTracker`), so no history is rebuilt from Python lists; the
penalty itself is :func:`rpt.sampling.lz.apply_codelength` / ``apply_closest_longest`` on the
LZ rows only, in place. Rows without LZ are never read or written. No vLLM import: the unit
tests drive it with the engine's batch operations (add, remove, move, swap).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from rpt.integrations.lz_settings import LZSettings
from rpt.sampling.lz import (
    append_token,
    apply_closest_longest,
    apply_codelength,
    lz_match_lengths,
    penalty_table,
)


@dataclass
class _Row:
    settings: LZSettings
    prompt: list[int] | None
    output: list[int]  # the engine's live list of the request's generated tokens
    consumed: int  # how many of them are in the device window


@dataclass
class _Group:
    """The device tensors of every row with one setting (indexed by batch row)."""

    tokens: torch.Tensor
    s: torch.Tensor
    rows: torch.Tensor | None = None  # the member rows on the device; None: stale
    members: list[int] = field(default_factory=list)


class LZRows:
    def __init__(self, max_rows: int, device: torch.device | str) -> None:
        self.max_rows, self.device = max_rows, torch.device(device)
        self.rows: dict[int, _Row] = {}
        self.groups: dict[LZSettings, _Group] = {}
        self._tables: dict[tuple[LZSettings, int], tuple[torch.Tensor, torch.Tensor]] = {}

    # ---- the batch's changes (vLLM order: removed, added, moved) -----------------------------------
    def add(self, row: int, settings: LZSettings | None, prompt: list[int] | None, output: list[int]) -> None:
        """Row ``row`` now holds a new request (overwriting whatever was there)."""
        self.remove(row)
        if settings is None:
            return
        consumed = _known(output)
        context = (list(prompt or []) if settings.include_prompt else []) + output[:consumed]
        group = self._group(settings)
        tokens = torch.full((1, settings.window), -1, dtype=torch.long)
        s = torch.zeros((1, settings.window), dtype=torch.long)
        if context:
            # from scratch once (the prompt, or a resumed request's tokens), then one token per step
            last, last_s, _ = lz_match_lengths(torch.tensor([context[-settings.window:]]), settings.window, settings.buffer)
            tokens[:, -last.shape[1]:], s[:, -last.shape[1]:] = last, last_s
        group.tokens[row], group.s[row] = tokens[0].to(self.device), s[0].to(self.device)
        self.rows[row] = _Row(settings, prompt, output, consumed)
        self._stale(settings)

    def remove(self, row: int) -> None:
        gone = self.rows.pop(row, None)
        if gone is not None:
            self._stale(gone.settings)

    def move(self, src: int, dst: int) -> None:
        """One-way: ``dst`` gets ``src``'s request (its own is overwritten), ``src`` is left empty."""
        self.remove(dst)
        moving = self.rows.pop(src, None)
        if moving is None:
            return
        group = self.groups[moving.settings]
        group.tokens[dst], group.s[dst] = group.tokens[src], group.s[src]
        self.rows[dst] = moving
        self._stale(moving.settings)

    def swap(self, a: int, b: int) -> None:
        ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
        for moving in (ra, rb):
            if moving is not None:
                self._stale(moving.settings)
        # copy both before writing either: within one group, the rows trade places
        saved = [(dst, moving, self.groups[moving.settings].tokens[src].clone(), self.groups[moving.settings].s[src].clone())
                 for src, dst, moving in ((a, b, ra), (b, a, rb)) if moving is not None]
        for dst, moving, tokens, s in saved:
            group = self.groups[moving.settings]
            group.tokens[dst], group.s[dst] = tokens, s
            self.rows[dst] = moving

    # ---- every step ----------------------------------------------------------------------------
    def sync(self) -> None:
        """Append each LZ row's newly generated tokens (usually one) to its device window."""
        pending: dict[tuple[LZSettings, int], tuple[list[int], list[int]]] = {}
        for row, state in list(self.rows.items()):
            if len(state.output) < state.consumed:  # the engine took tokens back: start the row again
                self.add(row, state.settings, state.prompt, state.output)
                continue
            known = _known(state.output, state.consumed)
            for k in range(state.consumed, known):
                rows, new = pending.setdefault((state.settings, k - state.consumed), ([], []))
                rows.append(row)
                new.append(state.output[k])
            state.consumed = known
        # one batched device update per (setting, k-th new token); k > 0 only after a multi-token step
        for (settings, _), (rows, new) in sorted(pending.items(), key=lambda kv: kv[0][1]):
            group = self.groups[settings]
            index = torch.tensor(rows, device=self.device)
            tokens, s = append_token(group.tokens[index], group.s[index],
                                     torch.tensor(new, device=self.device)[:, None], settings.buffer)
            group.tokens[index], group.s[index] = tokens, s

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The LZ penalty on the LZ rows of ``logits [rows, V]`` (contiguous), in place."""
        self.sync()
        width = logits.shape[-1]
        for settings, group in self.groups.items():
            rows = self._rows(group)
            if rows is None:
                continue
            tokens, s = group.tokens[rows], group.s[rows]
            if settings.variant == "closest_longest":
                apply_closest_longest(logits, tokens, s, tokens >= 0, settings.alpha, settings.buffer,
                                      math.log2(width), rows=rows)
            else:
                table, base = self._table(settings, width)
                apply_codelength(logits, tokens, settings.buffer - s, table, base, settings.window, rows=rows)
        return logits

    @property
    def active(self) -> bool:
        return bool(self.rows)

    # ---- bookkeeping ---------------------------------------------------------------------------
    def _group(self, settings: LZSettings) -> _Group:
        if settings not in self.groups:
            shape = (self.max_rows, settings.window)
            self.groups[settings] = _Group(torch.full(shape, -1, dtype=torch.long, device=self.device),
                                           torch.zeros(shape, dtype=torch.long, device=self.device))
        return self.groups[settings]

    def _stale(self, settings: LZSettings) -> None:
        self.groups[settings].rows = None

    def _rows(self, group: _Group) -> torch.Tensor | None:
        """The group's rows as a device tensor, rebuilt only after the batch changed."""
        if group.rows is None:
            settings = next(k for k, v in self.groups.items() if v is group)
            group.members = sorted(r for r, st in self.rows.items() if st.settings == settings)
            group.rows = torch.tensor(group.members, dtype=torch.long, device=self.device)
        return group.rows if group.members else None

    def _table(self, settings: LZSettings, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        key = (settings, width)
        if key not in self._tables:
            self._tables[key] = penalty_table(settings.alpha, settings.window, settings.buffer, math.log2(width),
                                              self.device)
        return self._tables[key]


def _known(output: list[int], start: int = 0) -> int:
    """How many leading tokens of ``output`` are real: an engine that schedules asynchronously
    appends -1 placeholders and fills them in before sampling."""
    n = len(output)
    for k in range(start, n):
        if output[k] < 0:
            return k
    return n
