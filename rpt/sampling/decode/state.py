r"""``DecodeState``: the device state of a decode as named tensors in static buffers.

The batch-flat steps (:mod:`rpt.sampling.decode.ntp_path` for NTP, :mod:`rpt.sampling.decode.rpt_path` for
RPT's common step, eager and compiled) are functions
of this state that write their results into it in place: the token layout, the step's column, which
rows are done and where they end, the NaN flags and the pending proposals of the last call. A
compiled (or CUDA-graph-replayed) step therefore reads and writes the same storage at every step,
and a pooled state (:mod:`rpt.sampling.decode.buffers`) the same storage in every decode of its
bucket: what graph replay needs, since a graph holds addresses, not tensors.

Per-decode values (prompts, pads, budgets, seeds, EOS ids) are copied *into* the buffers by
:meth:`DecodeState.load`; nothing a step reads is reassigned afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rpt.decode_forward.queries import Visibility
from rpt.sampling.config import TENSOR_KNOBS
from rpt.sampling.decode.proposal_layout import ProposalLayout


def _knob_dtype(device: torch.device) -> torch.dtype:
    # float64 as the Python floats an eager step uses (1 - top_p rounds as there); MPS has no float64
    return torch.float32 if device.type == "mps" else torch.float64


def eos_slots(count: int) -> int:
    """The EOS buffer's length for ``count`` ids: a power of two, at least 4 (unused slots hold -1, an id
    no token has), so decodes with a few EOS ids share one buffer shape."""
    size = 4
    while size < count:
        size *= 2
    return size


@dataclass(eq=False)
class DecodeState:
    """The decode's device tensors (shapes for ``batch`` rows and a layout ``width`` columns wide).

    Owner: the :class:`~rpt.sampling.decode.driver.Decoder` that allocated it (an eager decode: freed
    with the decoder), or the pool entry it was lent from (a compiled decode,
    :class:`~rpt.sampling.decode.buffers.DecodeBuffers`: freed when the pool drops the entry).
    """

    seqs: torch.Tensor  # [batch, width] long: prompts left-padded to W, then the generated tokens
    n: torch.Tensor  # 0-dim long: the column a step feeds (advanced in place by the step)
    done: torch.Tensor  # [batch] bool: NTP rows that produced their last token
    end: torch.Tensor  # [batch] long: NTP rows' last column (the budget's until done)
    bad: torch.Tensor  # [batch] bool: rows whose logits held NaN / inf since the last read
    flags: torch.Tensor  # [2] bool: (any bad row, all done / any event): the step's one host read
    seeds: torch.Tensor  # [batch] long: the rows' seeds keying their draws
    pads: torch.Tensor  # [batch] long: each row's left padding
    prompt: torch.Tensor  # [batch] long: all W (a tensor: an int would be a graph per prompt width)
    last_cols: torch.Tensor  # [batch] long: each row's last column of its budget
    eos: torch.Tensor  # [eos_slots] long: the EOS ids, -1 in unused slots
    alive: torch.Tensor  # [batch] bool: RPT rows the batch-flat step decodes
    draws: torch.Tensor  # [batch, ntp_draws] long: RPT rows' NTP proposals for the step's column
    # [len(TENSOR_KNOBS)] float64: the float sampling knobs a compiled step reads (SamplingConfig.traced)
    knobs: torch.Tensor
    pad_id: int = 0
    rows: int = 0  # the decode's rows; those after them pad the batch to its bucket (inert: done, never alive)
    ragged: bool = False  # some row is left-padded (then pads is the visibility's start)
    static: bool = False  # the buffers' addresses are marked static (pooled: compiled steps replay on them)
    # device tensors of each query-block pattern (rpt.sampling.decode.query_block.Pattern), kept with the
    # buffers so that a pooled state's compiled step reads the same tensors in every decode
    patterns: dict = field(default_factory=dict)
    pending: dict = field(default_factory=dict)  # ProposalLayout -> [batch, width] long: a call's proposals

    @classmethod
    def allocate(cls, batch: int, width: int, ntp_draws: int, eos_count: int, device: torch.device,
                 static: bool = False) -> DecodeState:
        """Zeroed buffers; ``static``: mark their addresses static for ``torch.compile`` (as the KV cache's),
        for a state reused by every decode of a bucket."""
        long = dict(dtype=torch.long, device=device)
        flag = dict(dtype=torch.bool, device=device)
        state = cls(seqs=torch.zeros(batch, width, **long), n=torch.zeros((), **long),
                    done=torch.zeros(batch, **flag), end=torch.zeros(batch, **long), bad=torch.zeros(batch, **flag),
                    flags=torch.zeros(2, **flag), seeds=torch.zeros(batch, **long), pads=torch.zeros(batch, **long),
                    prompt=torch.zeros(batch, **long), last_cols=torch.zeros(batch, **long),
                    eos=torch.zeros(eos_slots(eos_count), **long), alive=torch.zeros(batch, **flag),
                    draws=torch.zeros(batch, ntp_draws, **long),
                    knobs=torch.zeros(len(TENSOR_KNOBS), dtype=_knob_dtype(device), device=device), static=static)
        if static:
            for t in state.tensors():
                torch._dynamo.mark_static_address(t)
        return state

    def tensors(self) -> list[torch.Tensor]:
        """Every buffer a step may read (the patterns' and pending proposals' aside)."""
        return [self.seqs, self.n, self.done, self.end, self.bad, self.flags, self.seeds, self.pads, self.prompt,
                self.last_cols, self.eos, self.alive, self.draws, self.knobs]

    def load(self, rows: list[list[int]], width: int, pads: list[int], budgets: list[int], seeds: list[int],
             eos_ids: list[int], pad_id: int, knobs: list[float] | None = None) -> None:
        """Copy one decode's inputs into the buffers (``rows`` the prompts, left-padded to ``width``;
        ``knobs``: the config's :meth:`~rpt.sampling.config.SamplingConfig.knob_values`).

        A state of more rows than ``rows`` (a compiled decode's batch bucket) fills the others with copies
        of the last row -- real tokens, so every kernel computes what it computes for a real row (no fully
        masked attention row) -- marked done (an NTP step writes them their pad id and never waits for
        them) and never alive (an RPT step neither reads their flags nor commits for them): no row's
        tokens depend on them, as no row's depend on another's (position-keyed draws)."""
        batch = self.seqs.shape[0]
        if not 0 < len(rows) <= batch:
            raise AssertionError(f"a state for {batch} rows loaded with {len(rows)}")
        extra = batch - len(rows)
        rows, pads = list(rows) + [rows[-1]] * extra, list(pads) + [pads[-1]] * extra
        budgets, seeds = list(budgets) + [budgets[-1]] * extra, list(seeds) + [seeds[-1]] * extra
        host = torch.full(tuple(self.seqs.shape), pad_id, dtype=torch.long)
        for b, p in enumerate(rows):
            host[b, width - len(p): width] = torch.tensor(p, dtype=torch.long)
        self.seqs.copy_(host)
        self.pads.copy_(torch.tensor(pads))
        self.prompt.fill_(width)
        self.last_cols.copy_(torch.tensor(budgets) + (width - 1))
        self.seeds.copy_(torch.tensor(seeds, dtype=torch.long))
        self.eos.copy_(torch.tensor(list(eos_ids) + [-1] * (self.eos.numel() - len(eos_ids)), dtype=torch.long))
        if knobs is not None:
            self.knobs.copy_(torch.tensor(knobs, dtype=self.knobs.dtype))
        for t in (self.done, self.bad, self.flags, self.alive):
            t.zero_()
        self.done[batch - extra:] = True
        self.end.copy_(self.last_cols)
        self.n.fill_(width - 1)
        self.pad_id, self.ragged, self.rows = pad_id, max(pads, default=0) > 0, batch - extra

    @property
    def start_cols(self) -> torch.Tensor | None:
        """Each row's first visible column (None: no row is padded, every column from 0)."""
        return self.pads if self.ragged else None

    def ends_at(self, token: torch.Tensor, c) -> torch.Tensor:
        """``[batch]`` bool: rows for which ``token`` at column c is their last (an EOS id, or the last
        column of their budget)."""
        return (self.last_cols <= c) | torch.isin(token, self.eos)

    def column(self, c) -> torch.Tensor:
        """``[batch]``: the layout's column c (an int, or a 0-dim tensor inside a compiled step)."""
        return self.seqs[:, c] if isinstance(c, int) else self.seqs.index_select(1, c.view(1))[:, 0]

    def write_column(self, c, token: torch.Tensor) -> None:
        """Write ``token`` ``[batch]`` at column c, in place."""
        if isinstance(c, int):
            self.seqs[:, c] = token
        else:
            self.seqs.index_copy_(1, c.view(1), token[:, None])

    def query_inputs(self, pattern, ids: torch.Tensor, n) -> tuple:
        """A block's positions, cache columns, visibility and offset rows at column n (an int, or a 0-dim
        tensor inside a compiled step); ``pattern``: the block's device tensors (``src``, ``write``,
        ``limit``, ``since``, ``offsets``)."""
        src = pattern.src + n
        if not isinstance(n, int) or self.ragged:  # (ragged not read while tracing: no guard on it)
            # inside a compiled step always (zero pads give the same positions and mask), so that one
            # graph serves padded and unpadded batches: raggedness is a Python bool, which dynamo would
            # specialise on (a graph per kind of batch)
            positions = (src[None] - self.pads[:, None]).clamp(min=0)
            start = self.pads
        else:  # no left padding: positions are columns, every column from 0 visible
            positions, start = src[None].expand(ids.shape[0], -1), None
        offsets = None if pattern.offsets is None else pattern.offsets.expand_as(ids)
        return positions, pattern.write + n, Visibility(pattern.limit + n, start, pattern.since + n), offsets

    def pending_for(self, layout: ProposalLayout) -> torch.Tensor:
        """The buffer a call's proposals in ``layout`` are written to (allocated at its first use)."""
        buf = self.pending.get(layout)
        if buf is None:
            buf = self.pending[layout] = torch.zeros(self.seqs.shape[0], layout.width, dtype=torch.long,
                                                     device=self.seqs.device)
            if self.static:
                torch._dynamo.mark_static_address(buf)
        return buf
