"""The LZ state of Model Runner V2 (vLLM's GPU default): a setting per request slot, no vLLM import.

Model Runner V2 keeps each request's tokens on the device (``req_states.all_token_ids``, one row per
slot, slots recycled through a free list) and tells a processor only when a request enters a slot
(``add_request``); there is no removal hook. So the per-request state here is one setting per slot
(bounded by the runner's ``max_num_reqs``), and a setting's group (its id, its slot count, its
penalty table) lives while a slot holds it: it is freed when the last such slot is given to
another request. A setting is found in a dict (O(1)).

Each step (:meth:`LZSlots.apply`) the rows of each setting present in the batch are found on the
host from the step's slot list (``ctx.idx_mapping_np``), and only those rows' last ``W`` context
tokens are gathered from the device history and matched (:func:`~rpt.sampling.lz.definition.lz_match_lengths`):
the work is proportional to the live LZ rows. The row index is rebuilt (one small host-to-device
copy) only when the batch's slots or their settings change, not in a steady decode. Under
speculative decoding a request owns several logits rows whose count the host does not see; then
every group reads every row and masks the rows of other slots (``slot_group``, on the device).
"""

from __future__ import annotations

import math

import torch

from rpt.integrations.lz_settings import LZSettings
from rpt.sampling.lz.definition import lz_match_lengths
from rpt.sampling.lz.logits import apply_closest_longest, apply_codelength, penalty_table


class _SlotGroup:
    def __init__(self, gid: int) -> None:
        self.gid, self.slots = gid, 0
        self.table: tuple[int, torch.Tensor, torch.Tensor] | None = None  # (logits width, table, base)


class LZSlots:
    """Per-slot LZ settings of Model Runner V2 and the penalty each step (``req_states``: the
    runner's ``LogitsProcRequestState``: ``device``, ``max_num_reqs``, ``all_token_ids``,
    ``prompt_len``, ``total_len``)."""

    def __init__(self, req_states) -> None:
        self.req_states = req_states
        n = req_states.max_num_reqs
        self.settings: list[LZSettings | None] = [None] * n
        self.slot_group = torch.full((n,), -1, dtype=torch.long, device=req_states.device)  # for the masked path
        self.groups: dict[LZSettings, _SlotGroup] = {}
        self._free_ids: list[int] = []
        self._staged: dict[int, int] = {}
        self._layout: tuple[bytes, int, dict[LZSettings, torch.Tensor]] | None = None  # last step's row index
        self._version = 0  # bumped by every add: a cached row index is stale

    def add(self, slot: int, settings: LZSettings | None) -> bool:
        """A request enters ``slot`` (whatever held it is over); whether it asks for the LZ penalty."""
        old = self.settings[slot]
        if old is not None:
            group = self.groups[old]
            group.slots -= 1
            if group.slots == 0:  # its last request is gone: free the group and its table
                del self.groups[old]
                self._free_ids.append(group.gid)
        self.settings[slot] = settings
        gid = -1
        if settings is not None:
            group = self.groups.get(settings)
            if group is None:
                group = self.groups[settings] = _SlotGroup(self._free_ids.pop() if self._free_ids else len(self.groups))
            group.slots += 1
            gid = group.gid
        self._staged[slot] = gid
        self._version += 1
        return settings is not None

    def apply_staged_writes(self) -> None:
        if self._staged:
            slots = torch.tensor(list(self._staged), dtype=torch.long)
            values = torch.tensor(list(self._staged.values()), dtype=torch.long)
            self.slot_group[slots.to(self.slot_group.device)] = values.to(self.slot_group.device)
            self._staged.clear()

    def apply(self, logits: torch.Tensor, ctx) -> torch.Tensor:
        slots = ctx.idx_mapping_np
        if logits.shape[0] == len(slots):  # one logits row per request: each setting's rows are known here
            for settings, rows in self._rows_by_setting(slots, logits.device).items():
                self._apply_group(logits, ctx, settings, rows)
        else:  # speculative decoding: rows per request unknown on the host, mask the other slots' rows
            for settings in {self.settings[i] for i in slots.tolist()} - {None}:
                self._apply_group(logits, ctx, settings, None)
        return logits

    def _rows_by_setting(self, slots, device) -> dict[LZSettings, torch.Tensor]:
        key = slots.tobytes()
        if self._layout is None or self._layout[0] != key or self._layout[1] != self._version:
            by: dict[LZSettings, list[int]] = {}
            for row, slot in enumerate(slots.tolist()):
                settings = self.settings[slot]
                if settings is not None:
                    by.setdefault(settings, []).append(row)
            index = {st: torch.tensor(rows, dtype=torch.long).to(device, non_blocking=True) for st, rows in by.items()}
            self._layout = (key, self._version, index)
        return self._layout[2]

    def _apply_group(self, logits: torch.Tensor, ctx, settings: LZSettings, rows: torch.Tensor | None) -> None:
        rs, w = self.req_states, settings.window
        row = torch.arange(logits.shape[0], device=logits.device) if rows is None else rows
        slot = ctx.expanded_idx_mapping.long()[row]
        local = ctx.expanded_local_pos.long()[row]
        total = rs.total_len.gpu[slot].long()
        start = torch.zeros_like(total) if settings.include_prompt else rs.prompt_len.gpu[slot].long()
        length = total + local  # the row's context: committed tokens, then this step's drafts before it
        q = length[:, None] - w + torch.arange(w, device=logits.device)  # positions of the window's columns
        history = rs.all_token_ids.gpu
        committed = history[slot[:, None], q.clamp(0, history.shape[1] - 1)]
        # input_ids at local position 0 is the last committed token; drafts follow it
        drafted = ctx.input_ids[(row[:, None] - local[:, None] + 1 + q - total[:, None]).clamp(0, ctx.input_ids.shape[0] - 1)]
        tokens = torch.where(q < total[:, None], committed, drafted).long()
        lengths = (length - start).clamp(0, w)
        if rows is None:  # rows of other requests have no real column (lengths 0): their penalty is 0, a no-op
            lengths = lengths.masked_fill(self.slot_group[slot] != self.groups[settings].gid, 0)
        tokens, s, valid = lz_match_lengths(tokens, w, settings.buffer, lengths)
        if settings.variant == "closest_longest":
            apply_closest_longest(logits, tokens, s, valid, settings.alpha, settings.buffer, math.log2(logits.shape[-1]),
                                  rows=rows)
        else:
            table, base = self._table(settings, logits.shape[-1], logits.device)
            apply_codelength(logits, tokens, settings.buffer - s, table, base, w, rows=rows)

    def _table(self, settings: LZSettings, width: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        group = self.groups[settings]
        if group.table is None or group.table[0] != width:
            group.table = (width, *penalty_table(settings.alpha, settings.window, settings.buffer, math.log2(width),
                                                 device))
        return group.table[1], group.table[2]

    def state_bytes(self) -> int:
        """Device memory held beyond the per-slot arrays: the live groups' penalty tables."""
        return sum(t.numel() * t.element_size() for g in self.groups.values() if g.table for t in g.table[1:])
