"""Cross-entropy over a large vocabulary without materialising ``[batch, seq, vocab]`` logits.

``chunked_cross_entropy(hidden, head, labels)`` returns the per-token float32 cross-entropy of
``head(hidden)`` -- the same numbers as ``F.cross_entropy(head(hidden).float(), labels,
reduction="none")`` -- computing the logits for ``chunk`` tokens at a time. Each chunk runs under
non-reentrant activation checkpointing: the forward pass keeps only the chunk's hidden states
(already alive) and its per-token losses; the backward pass recomputes that chunk's logits,
takes their gradient and frees them before the next chunk. Peak memory therefore holds the
float32 logits of one chunk (a few copies of ``chunk x vocab x 4`` bytes), not of the batch;
the price is one extra ``hidden @ W_head`` product per token (2 H V FLOPs).

The head is called as a module, once per chunk, so DeepSpeed ZeRO-3 gathers its (partitioned)
weight the way it does for any module, and DDP sees one gradient per parameter. (Liger's fused
linear cross-entropy avoids the recomputation on a GPU by computing the gradient in the forward
pass, but it reads the weight outside the module, which ZeRO-3 does not allow.)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from rpt.objective import IGNORE_INDEX


def chunk_tokens(vocab_size: int, budget_bytes: int) -> int:
    """Tokens per chunk so one float32 ``[chunk, vocab]`` tensor fits in ``budget_bytes``."""
    return max(1, budget_bytes // (4 * vocab_size))


def _chunk_loss(hidden: torch.Tensor, labels: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    logits = head(hidden).float()
    return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="none")


def chunked_cross_entropy(
    hidden: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], labels: torch.Tensor, chunk: int
) -> torch.Tensor:
    """Per-token float32 CE of ``head(hidden)`` (``hidden``: ``[N, H]``, ``labels``: ``[N]``)."""
    losses = []
    for h, y in zip(hidden.split(chunk), labels.split(chunk)):
        if torch.is_grad_enabled() and h.requires_grad:
            losses.append(checkpoint(_chunk_loss, h, y, head, use_reentrant=False))
        else:
            losses.append(_chunk_loss(h, y, head))
    return torch.cat(losses)
