"""Which Hugging Face causal LMs :class:`~rpt.model.RPTForCausalLM` can hold, and one line for the rest.

The wrapper reaches the base model through two inputs only: ``inputs_embeds`` (token embedding plus
an offset-table row) and ``position_ids = sigma - 1``, the positions of the permuted window. A
family is refused when either cannot work:

* **no position ids** -- ALiBi models (BLOOM, MPT, Falcon with ``alibi=True``) place tokens by
  attention biases computed from their order in the sequence and take no ``position_ids`` (BLOOM
  and MPT have no such argument; Falcon ignores it under ALiBi). The permuted window's positions
  cannot reach them: training would read the permuted order as the text's order, and decoding
  would not match the reference.
* **an input embedding that is not a row lookup times a constant** -- the saved checkpoint folds
  the NTP row into the embedding matrix (:mod:`rpt.checkpoint.folded_weights`), exact only for such an
  embedding; any other would make plain ``transformers`` compute another model.

The families tested end to end (wrap == base, a training step, fast == reference decoding,
plain-``transformers`` logits == RPT's after a save) are :data:`TESTED_FAMILIES`; others that pass
these checks are wrapped, untested.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from rpt.checkpoint.folded_weights import input_embedding_scale

# model_type -> the name the docs use; every one checked by tests/end_to_end/test_model_zoo.py; README.md and docs/science.md list them
TESTED_FAMILIES = {
    "llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "mistral": "Mistral", "mixtral": "Mixtral", "phi": "Phi",
    "phi3": "Phi-3", "gpt_neox": "GPT-NeoX", "olmo2": "OLMo 2", "granite": "Granite", "stablelm": "StableLM",
    "starcoder2": "Starcoder2", "cohere": "Cohere", "smollm3": "SmolLM3", "gpt2": "GPT-2", "gpt_bigcode": "GPTBigCode",
    "gptj": "GPT-J", "opt": "OPT", "falcon": "Falcon (rotary)", "gemma": "Gemma", "gemma2": "Gemma 2",
    "gemma3_text": "Gemma 3 (text)",
}


class UnsupportedArchitecture(ValueError):
    """A base model RPT cannot wrap; the message names the architecture and why, in one line."""


def _name(config, model_class: type | None) -> str:
    if model_class is not None:
        return model_class.__name__
    architectures = getattr(config, "architectures", None) or []
    return architectures[0] if architectures else f"model_type {getattr(config, 'model_type', '?')!r}"


def uses_alibi(config) -> bool:
    """The config places tokens by ALiBi attention biases (Falcon's ``alibi``, MPT's ``attn_config.alibi``,
    BLOOM always)."""
    if getattr(config, "model_type", None) == "bloom":
        return True
    return bool(getattr(config, "alibi", False) or getattr(getattr(config, "attn_config", None), "alibi", False))


def position_refusal(config, model_class: type | None = None) -> str | None:
    """``"<Class> is an ALiBi model (...)"`` / ``"<Class> takes no position_ids ..."`` when a model of
    ``config`` (and ``model_class``, when known) cannot be given position ids; None when it can."""
    name = _name(config, model_class)
    if uses_alibi(config):
        return f"{name} is an ALiBi model (positions enter as attention biases from the token order; it takes no position ids)"
    if model_class is not None and "position_ids" not in inspect.signature(model_class.forward).parameters:
        return f"{name} takes no position_ids in its forward"
    return None


def architecture_refusal(config, model_class: type | None = None) -> str | None:
    """Why a model of ``config`` (and ``model_class``, when known) cannot be wrapped; None when it can."""
    why = position_refusal(config, model_class)
    if why is None:
        return None
    return (f"{why}, so RPT's permuted window cannot give it the tokens' positions: training would read the permuted "
            "order as the text's; use a model with rotary or learned positions (Llama, Qwen, Mistral, Falcon with "
            "alibi=False, GPT-2, ...)")


def hf_model(lm: nn.Module) -> nn.Module:
    """The Hugging Face model inside ``lm`` (a PEFT model's base model; else ``lm``)."""
    return lm.get_base_model() if hasattr(lm, "get_base_model") else lm


def causal_lm_class(config) -> type | None:
    """The ``AutoModelForCausalLM`` class of ``config`` (None when transformers maps none)."""
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:
        return None


def _materialised(weight: torch.Tensor) -> bool:
    # a ZeRO-3 partition (an empty local shard) or a meta tensor has no values to look up here
    return weight.numel() > 0 and weight.device.type != "meta" and not hasattr(weight, "ds_id")


def embedding_refusal(lm: nn.Module) -> str | None:
    """Why ``lm``'s input embedding cannot take the folded NTP row: its output is not ``weight[ids]``
    times :func:`~rpt.checkpoint.folded_weights.input_embedding_scale` (checked on a few rows)."""
    embedding = lm.get_input_embeddings()
    weight = getattr(embedding, "weight", None)
    if weight is not None and not _materialised(weight):
        return None  # before the shape check: a ZeRO-3 partition's local weight is flat (its shape is ds_shape)
    if weight is None or weight.dim() != 2:
        return f"{type(lm).__name__}'s input embedding ({type(embedding).__name__}) has no [vocab, hidden] weight"
    ids = torch.arange(min(4, weight.shape[0]), device=weight.device)[None]
    with torch.no_grad():
        looked_up = embedding(ids)
        expected = nn.functional.embedding(ids, weight) * torch.tensor(input_embedding_scale(embedding), dtype=weight.dtype)
    if looked_up.shape != expected.shape or not torch.allclose(looked_up.float(), expected.float(), rtol=1e-3, atol=0):
        return (f"{type(lm).__name__}'s input embedding ({type(embedding).__name__}) is not a row lookup times a constant, "
                "so the offset table's NTP row cannot be folded into a checkpoint plain transformers loads as the trained "
                "model")
    return None


def check_architecture(lm: nn.Module) -> None:
    """Raise :class:`UnsupportedArchitecture` (one line) unless RPT can wrap ``lm``."""
    inner = hf_model(lm)
    reason = architecture_refusal(inner.config, type(inner)) or embedding_refusal(inner)
    if reason is not None:
        raise UnsupportedArchitecture(f"cannot wrap for RPT: {reason}")
