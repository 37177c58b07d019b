"""The LZ state of a persistent batch whose rows come, go and move (vLLM's V1 logits processors).

Each live LZ row keeps its last ``W`` context tokens and their match lengths in device tensors
(right-aligned, -1 gaps), in a slot of its setting's group: one ``[slots, W]`` pair per distinct
setting of the live rows. Every step each row gains the token the engine appended to its output
list: :func:`rpt.sampling.lz.incremental.append_token` updates the row on the device in O(W) (the
recurrence of :class:`~rpt.sampling.lz.incremental.LZMatchTracker`), so no history is rebuilt from
Python lists; the penalty itself is :func:`rpt.sampling.lz.logits.apply_codelength` /
``apply_closest_longest`` on the LZ rows only, in place. Rows without LZ are never read or
written. No vLLM import: the unit tests drive it with the engine's batch operations (add, remove,
move, swap).

**Bounded by the live rows.** A group lives while a row uses its setting and is freed (tensors and
penalty table) with its last row; its slots grow by doubling and shrink when three quarters are
free, so the state is O(live LZ rows x W) whatever the server has seen. A row's setting is found
in a dict (O(1)); a move or swap of rows relabels slots and copies no tensor; each step's work is
a loop over the live LZ rows and their groups. Windows and buffers are bounded at admission
(:mod:`rpt.integrations.lz_settings`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rpt.integrations.lz_settings import LZSettings
from rpt.sampling.lz.definition import lz_match_lengths
from rpt.sampling.lz.incremental import append_token
from rpt.sampling.lz.logits import apply_closest_longest, apply_codelength, penalty_table


@dataclass
class _Row:
    settings: LZSettings
    prompt: list[int] | None
    output: list[int]  # the engine's live list of the request's generated tokens
    consumed: int  # how many of them are in the device window
    slot: int  # its row of the group's tensors


class _Group:
    """The device windows of the live rows with one setting: one slot each, ``members`` batch row -> slot."""

    def __init__(self, settings: LZSettings, device: torch.device) -> None:
        self.settings, self.device = settings, device
        self.tokens = torch.full((1, settings.window), -1, dtype=torch.long, device=device)
        self.s = torch.zeros((1, settings.window), dtype=torch.long, device=device)
        self.free = [0]
        self.members: dict[int, int] = {}
        self.index: tuple[torch.Tensor, torch.Tensor] | None = None  # (batch rows, slots) on the device; None: stale
        self.table: tuple[int, torch.Tensor, torch.Tensor] | None = None  # (logits width, table, base)

    def take_slot(self) -> int:
        if not self.free:  # full: twice the slots (amortised O(1) per row)
            n = self.tokens.shape[0]
            self.tokens = torch.cat([self.tokens, torch.full_like(self.tokens, -1)])
            self.s = torch.cat([self.s, torch.zeros_like(self.s)])
            self.free = list(range(2 * n - 1, n - 1, -1))
        return self.free.pop()

    def give_slot(self, slot: int, rows: dict[int, _Row]) -> None:
        self.free.append(slot)
        capacity = self.tokens.shape[0]
        if capacity >= 8 and len(self.members) <= capacity // 4:  # mostly empty: half the slots, members first
            order = sorted(self.members.items(), key=lambda rs: rs[1])
            keep = torch.tensor([slot for _, slot in order], dtype=torch.long, device=self.device)
            half = capacity // 2
            tokens = torch.full((half, self.tokens.shape[1]), -1, dtype=torch.long, device=self.device)
            s = torch.zeros_like(tokens)
            tokens[: len(order)], s[: len(order)] = self.tokens[keep], self.s[keep]
            self.tokens, self.s = tokens, s
            for new, (row, _) in enumerate(order):
                self.members[row] = rows[row].slot = new
            self.free = list(range(half - 1, len(order) - 1, -1))
            self.index = None

    def rows_and_slots(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The members' batch rows and slots on the device, rebuilt only after the batch changed."""
        if self.index is None:
            rows = sorted(self.members)
            self.index = (torch.tensor(rows, dtype=torch.long, device=self.device),
                          torch.tensor([self.members[r] for r in rows], dtype=torch.long, device=self.device))
        return self.index


class LZRows:
    def __init__(self, max_rows: int, device: torch.device | str) -> None:
        self.max_rows, self.device = max_rows, torch.device(device)
        self.rows: dict[int, _Row] = {}
        self.groups: dict[LZSettings, _Group] = {}

    # ---- the batch's changes (vLLM order: removed, added, moved) -----------------------------------
    def add(self, row: int, settings: LZSettings | None, prompt: list[int] | None, output: list[int]) -> None:
        """Row ``row`` now holds a new request (overwriting whatever was there)."""
        self.remove(row)
        if settings is None:
            return
        consumed = _known(output)
        context = (list(prompt or []) if settings.include_prompt else []) + output[:consumed]
        group = self.groups.get(settings)
        if group is None:
            group = self.groups[settings] = _Group(settings, self.device)
        slot = group.take_slot()
        tokens = torch.full((1, settings.window), -1, dtype=torch.long)
        s = torch.zeros((1, settings.window), dtype=torch.long)
        if context:
            # from scratch once (the prompt, or a resumed request's tokens), then one token per step
            last, last_s, _ = lz_match_lengths(torch.tensor([context[-settings.window:]]), settings.window, settings.buffer)
            tokens[:, -last.shape[1]:], s[:, -last.shape[1]:] = last, last_s
        group.tokens[slot], group.s[slot] = tokens[0].to(self.device), s[0].to(self.device)
        self.rows[row] = _Row(settings, prompt, output, consumed, slot)
        group.members[row] = slot
        group.index = None

    def remove(self, row: int) -> None:
        """The request of ``row`` finished: its slot is freed, and its group with its last row."""
        gone = self.rows.pop(row, None)
        if gone is None:
            return
        group = self.groups[gone.settings]
        del group.members[row]
        group.index = None
        if not group.members:
            del self.groups[gone.settings]  # its tensors and penalty table go with it
        else:
            group.give_slot(gone.slot, self.rows)

    def move(self, src: int, dst: int) -> None:
        """One-way: ``dst`` gets ``src``'s request (its own is overwritten), ``src`` is left empty."""
        self.remove(dst)
        moving = self.rows.pop(src, None)
        if moving is None:
            return
        self.rows[dst] = moving
        self._relabel(moving, src, dst)

    def swap(self, a: int, b: int) -> None:
        ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
        for moving, src in ((ra, a), (rb, b)):  # both leave their rows before either arrives
            if moving is not None:
                del self.groups[moving.settings].members[src]
        for moving, dst in ((ra, b), (rb, a)):
            if moving is not None:
                self.rows[dst] = moving
                group = self.groups[moving.settings]
                group.members[dst], group.index = moving.slot, None

    def _relabel(self, moving: _Row, src: int, dst: int) -> None:
        group = self.groups[moving.settings]
        del group.members[src]
        group.members[dst], group.index = moving.slot, None  # the window stays in its slot: no copy

    # ---- every step ----------------------------------------------------------------------------
    def sync(self) -> None:
        """Append each LZ row's newly generated tokens (usually one) to its device window."""
        pending: dict[tuple[LZSettings, int], list[tuple[int, int]]] = {}  # (setting, k) -> (row, token)
        for row, state in list(self.rows.items()):
            if len(state.output) < state.consumed:  # the engine took tokens back: start the row again
                self.add(row, state.settings, state.prompt, state.output)
                continue
            known = _known(state.output, state.consumed)
            for k in range(state.consumed, known):
                pending.setdefault((state.settings, k - state.consumed), []).append((row, state.output[k]))
            state.consumed = known
        # one batched device update per (setting, k-th new token); k > 0 only after a multi-token step.
        # Slots are read now, not in the loop above: restarting a row may have compacted its group.
        for (settings, _), updates in sorted(pending.items(), key=lambda kv: kv[0][1]):
            group = self.groups[settings]
            slots = torch.tensor([self.rows[row].slot for row, _ in updates], device=self.device)
            new = torch.tensor([token for _, token in updates], device=self.device)[:, None]
            group.tokens[slots], group.s[slots] = append_token(group.tokens[slots], group.s[slots], new, settings.buffer)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The LZ penalty on the LZ rows of ``logits [rows, V]`` (contiguous), in place."""
        self.sync()
        width = logits.shape[-1]
        for settings, group in self.groups.items():
            rows, slots = group.rows_and_slots()
            tokens, s = group.tokens[slots], group.s[slots]
            if settings.variant == "closest_longest":
                apply_closest_longest(logits, tokens, s, tokens >= 0, settings.alpha, settings.buffer,
                                      math.log2(width), rows=rows)
            else:
                if group.table is None or group.table[0] != width:
                    group.table = (width, *penalty_table(settings.alpha, settings.window, settings.buffer,
                                                         math.log2(width), self.device))
                apply_codelength(logits, tokens, settings.buffer - s, group.table[1], group.table[2], settings.window,
                                 rows=rows)
        return logits

    @property
    def active(self) -> bool:
        return bool(self.rows)

    def state_bytes(self) -> int:
        """Device memory held for the live rows (windows, match lengths, penalty tables)."""
        total = 0
        for group in self.groups.values():
            tensors = [group.tokens, group.s, *(group.table[1:] if group.table else ())]
            total += sum(t.numel() * t.element_size() for t in tensors)
        return total


def _known(output: list[int], start: int = 0) -> int:
    """How many leading tokens of ``output`` are real: an engine that schedules asynchronously
    appends -1 placeholders and fills them in before sampling."""
    n = len(output)
    for k in range(start, n):
        if output[k] < 0:
            return k
    return n
