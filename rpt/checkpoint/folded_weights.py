"""Faithful HF weights: fold the offset table's NTP row into the input embedding on save.

``RPTForCausalLM`` adds ``table[0]`` (the NTP "+1" offset row) to every token embedding when it
predicts the next token. A checkpoint whose base weights lack that row is, for plain
``transformers`` / vLLM / lm-eval ``hf``, a *different* model. So a checkpoint (format version 2)
stores

* the input embedding ``E' = E + table[0]`` (every vocabulary row), so ``AutoModelForCausalLM``
  computes exactly the trained model's NTP logits;
* the table relative to the folded row, ``table' = table - table[0]`` (row 0 becomes zero), so
  ``E' + table'[o] = E + table[o]`` for every offset row ``o``: RPT is unchanged.

A family whose input embedding multiplies the looked-up rows by a constant ``c`` (Gemma, Gemma 2,
Gemma 3: ``c = sqrt(hidden)``, applied inside the embedding module, so RPT adds ``table[0]`` *after*
it) stores ``E' = E + table[0] / c`` instead: ``c * E'[x] = c * E[x] + table[0]``, the trained
model's input (:func:`input_embedding_scale` reads ``c``; the wrapper refuses an embedding that is
no such lookup, :mod:`rpt.model.architectures`).

Tied input/output embeddings must be untied for this (the output head keeps ``E``): the checkpoint
grows by one ``vocab x hidden`` matrix, e.g. 128256 x 2048 x 2 bytes = 525 MB (+21%) for the tied
Llama-3.2-1B in bfloat16, 4096 x 192 x 4 bytes = 3.1 MB (+24%) for the demo's float32 model.
Untied models (Llama-3-8B) cost nothing extra.

Format version 1 (older checkpoints) stored ``E`` and the absolute table; both load.
"""

from __future__ import annotations

import torch
from torch import nn

FORMAT_UNFOLDED = 1  # base weights without the NTP row; absolute table
FORMAT_FOLDED = 2  # NTP row folded into the input embedding; table relative to it


def module_key(model: nn.Module, module: nn.Module | None) -> str | None:
    """The state-dict name of ``module.weight`` inside ``model`` (None when absent)."""
    if module is None:
        return None
    for name, sub in model.named_modules(remove_duplicate=False):
        if sub is module:
            return f"{name}.weight" if name else "weight"
    return None


def embeddings_tied(lm: nn.Module) -> bool:
    out = lm.get_output_embeddings()
    if out is None:
        return False
    if out.weight is lm.get_input_embeddings().weight:
        return True
    # Under ZeRO-3 the two parameters can be distinct objects; the config still says "tied".
    return bool(getattr(lm.config, "tie_word_embeddings", False))


def input_embedding_scale(embedding: nn.Module) -> float:
    """The constant the input embedding module multiplies its looked-up rows by (1.0 for a plain
    ``nn.Embedding``; Gemma's scaled embeddings hold it as ``embed_scale``, applied in the weight's dtype)."""
    scale = getattr(embedding, "embed_scale", None)
    if scale is None:
        return 1.0
    if isinstance(scale, torch.Tensor):
        weight = getattr(embedding, "weight", None)
        # the module multiplies by the scale rounded to the weight's dtype: fold with that same number
        return float(scale.detach().to(weight.dtype if weight is not None else scale.dtype).float().cpu())
    return float(scale)


def fold_ntp_row(base_state: dict[str, torch.Tensor], table: torch.Tensor, input_key: str,
                 output_key: str | None, tied: bool, scale: float = 1.0) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """``(state', table')`` of format version 2 from the in-training weights (copies; inputs untouched);
    ``scale``: the input embedding's constant factor (:func:`input_embedding_scale`).

    The addition runs in float32 and is rounded once to the embedding's dtype.
    """
    state = dict(base_state)
    embedding = state[input_key]
    row = table[0].to(device=embedding.device, dtype=torch.float32) / scale
    if tied and output_key is not None:
        # The head keeps the unfolded matrix: a separate tensor, so HF's save keeps both keys.
        state[output_key] = embedding.detach().clone()
    state[input_key] = (embedding.detach().float() + row).to(embedding.dtype)
    relative = (table.detach().float() - table[0].detach().float()).to(table.dtype)
    return state, relative
