r"""``StepContext``: what every step of one decode works on, whichever driver runs it -- the decode
state, the model queries, the proposer, the layout's columns, the compiled steps of the decode's
buffers -- and the eager model call of a query block.

The per-row driver (:class:`~rpt.sampling.decode.driver.Decoder`) builds one per decode and hands it to
the batch-flat paths (:class:`~rpt.sampling.decode.ntp_path.NTPPath`,
:class:`~rpt.sampling.decode.rpt_path.RPTPath`): they read and write the decode through it, and reach
the model only through its :attr:`~StepContext.queries`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rpt.decode_forward.queries import ModelQueries
from rpt.sampling.config import SamplingConfig
from rpt.sampling.decode.contexts import GrowingContexts
from rpt.sampling.decode.query_block import Block, Pattern
from rpt.sampling.decode.state import DecodeState
from rpt.sampling.proposals import Proposer


@dataclass(eq=False)
class StepContext:
    """One decode's device side, shared by its drivers."""

    config: SamplingConfig
    traced: SamplingConfig  # what a compiled step traces (SamplingConfig.traced), the config itself eagerly
    state: DecodeState
    queries: ModelQueries
    proposer: Proposer
    device: torch.device  # the prompts' device
    width: int  # W: the prompts' width, so the first generated column
    last: int  # the last column a row may generate
    window: int  # w: the RPT window (the plan's)
    compile_backend: str | Callable | None  # None: an eager decode
    steps: dict  # the compiled steps of the decode's buffers, by name (built at first use, pooled with them)

    @property
    def batch(self) -> int:
        """The state's rows (compiled: the batch bucket; rows past the decode's are inert)."""
        return self.state.seqs.shape[0]

    def pattern(self, block: Block) -> Pattern:
        """The block's device tensors, cached in the state (a decode uses a handful)."""
        patterns = self.state.patterns
        pattern = patterns.get(block)
        if pattern is None:
            pattern = patterns[block] = Pattern(block, self.device, self.proposer.ntp_draws, self.state.static)
        return pattern

    def to_device(self, values: list) -> torch.Tensor:
        """A host list as a device tensor; on CUDA through pinned memory, so the copy does not wait for
        the GPU (a copy from pageable memory synchronises the stream)."""
        t = torch.tensor(values, dtype=torch.long)
        return t.pin_memory().to(self.device, non_blocking=True) if self.device.type == "cuda" else t.to(self.device)

    def contexts(self) -> GrowingContexts:
        """The eager steps' contexts: slices of the layout, proposed on by the decode's proposer."""
        return GrowingContexts(self.proposer, self.state.seqs)

    def eager_call(self, block: Block, pattern: Pattern, n: int) -> Callable[..., torch.Tensor]:
        """``call(ids, positions, columns, visibility, offsets=, keep=)``: the logits of the block's eager call at
        column n, over the cache up to the block's last scratch column (a partial of the queries, so no
        Python frame of its own)."""
        plain = block.region == 1 and not block.lags and not self.state.ragged  # x_n alone sees every column
        return functools.partial(self.queries, kv_len=n + 1 + pattern.scratch, plain=plain)

    def logits(self, block: Block, pattern: Pattern, ids: torch.Tensor, n: int) -> torch.Tensor:
        """The kept logits ``[batch, K, V]`` of the block's eager call at column n feeding ``ids`` ``[batch, Q]``."""
        positions, columns, vis, offsets = self.state.query_inputs(pattern, ids, n)
        return self.eager_call(block, pattern, n)(ids, positions, columns, vis, offsets=offsets, keep=pattern.keep)
