"""``compile: true``: ``torch.compile`` on each transformer block, as torchtitan compiles its models.

Compiling the blocks, not the whole model, keeps what varies from step to step outside the
graph: the embedding of the permuted tokens, their offsets, the rotary tables built from the
step's ``position_ids``, the causal-mask decision, and the tiled loss head (:mod:`rpt.model.loss`,
whose Python loop over vocabulary blocks a graph would unroll). Each block then sees the same
shapes every step -- the objective's permutations arrive as data (hidden states and rotary
tables), never as shapes -- so the blocks compile once. Every block of a model shares one graph
(torch passes a block's parameters in as inputs), so compile time is that of one block.

``nn.Module.compile`` compiles a block in place: parameter names, ``state_dict`` keys,
checkpoints and hooks (DDP's, DeepSpeed ZeRO-2's) are those of the eager model.
"""

from __future__ import annotations

import torch
from torch import nn


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks of a Hugging Face model: the members of its ``nn.ModuleList``
    of ``GradientCheckpointingLayer`` (every decoder layer of transformers 5 derives from it)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) and all(
            isinstance(block, GradientCheckpointingLayer) for block in module
        ):
            return list(module)
    return []


def compile_blocks(model: nn.Module, backend: str = "inductor") -> int:
    """Compile every transformer block of ``model`` in place; returns how many there are."""
    blocks = transformer_blocks(model)
    if not blocks:
        raise ValueError(f"compile: true found no transformer blocks in {type(model).__name__} (no ModuleList of "
                         "transformers GradientCheckpointingLayer); train it with compile: false")
    for block in blocks:
        # fullgraph: a graph break inside a block would split it and silently cost the speed-up
        block.compile(backend=backend, fullgraph=True)
    return len(blocks)


def eager_blocks():
    """A context in which compiled blocks run their eager code: evaluation runs here, so that its
    no-grad forwards and a smaller last batch compile nothing (and trigger no recompilation)."""
    return torch.compiler.set_stance("force_eager")
