"""LoRA fine-tuning with RPT: a PEFT adapter on the base model, the offset table trained in full.

PEFT's ``trainable_token_indices`` / ``modules_to_save`` cover rows or copies of *existing*
modules; the offset table is a new module outside the HF model, so it stays an ordinary
trainable parameter of :class:`~rpt.model.RPTForCausalLM` beside the injected adapter (PEFT's
``inject_adapter_in_model``: the HF model keeps its class, so the RPT forward is unchanged).

A LoRA checkpoint is a standard PEFT adapter directory (``adapter_config.json`` +
``adapter_model.safetensors``, loadable with ``PeftModel.from_pretrained``) plus the table,
``rpt_config.json`` (``"lora": {"base": ...}``) and the tokenizer. The table is what the RPT model
adds to *the base model's* input embedding (nothing is folded: the base is not written). A base
built from a config spec has no path to refer to, so its (frozen) weights go to ``base/``.
:func:`load_lora` merges the adapter for inference; :func:`merge` writes a full faithful checkpoint.

The adapter only makes sense on the base it was trained on, so ``rpt_config.json`` records a
fingerprint of that base (:func:`base_fingerprint`: the shapes and a strided sample of values of
a few named tensors) and loading or merging onto a base that does not match is refused.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer

from rpt.checkpoint.directories import CheckpointError, clear_dir, commit_dir, temp_dir_for
from rpt.checkpoint.folded_weights import module_key
from rpt.checkpoint.model_ref import ModelRefError, resolve_model_ref
from rpt.model.wrapper import (
    RPT_CONFIG_NAME,
    RPT_FORMAT_VERSION,
    RPTForCausalLM,
    load_causal_lm,
    offset_rows,
    register_checkpoint_loader,
    save_table,
)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
BASE_SUBDIR = "base"
_PREFIX = "base_model.model."  # PEFT's key prefix in a saved adapter (PeftModel -> LoraModel -> model)


def lora_config(section: dict[str, Any]):
    try:
        from peft import LoraConfig
    except ImportError:
        raise ImportError("LoRA needs peft: pip install peft (or pip install -e .)") from None
    return LoraConfig(
        r=int(section.get("r", 8)), lora_alpha=float(section.get("alpha", 16)),
        lora_dropout=float(section.get("dropout", 0.0)),
        # all-linear: every linear layer but the output head (PEFT's rule)
        target_modules=section.get("target_modules", "all-linear"), task_type="CAUSAL_LM",
    )


def add_lora(model, section: dict[str, Any]) -> dict[str, int]:
    """Inject the adapter into ``model.lm`` and freeze everything but the adapter and the table.

    Returns the parameter counts ``{"adapter", "table", "trainable", "total"}``.
    """
    from peft import inject_adapter_in_model

    inject_adapter_in_model(lora_config(section), model.lm)
    for name, p in model.lm.named_parameters():
        p.requires_grad_("lora_" in name)
    model.offset_embedding.weight.requires_grad_(True)
    return parameter_counts(model)


def parameter_counts(model) -> dict[str, int]:
    adapter = sum(p.numel() for n, p in model.lm.named_parameters() if "lora_" in n)
    return {"adapter": adapter, "table": model.offset_embedding.weight.numel(),
            "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "total": sum(p.numel() for p in model.parameters())}


def parameter_line(model) -> str:
    """The log line saying what a LoRA run trains."""
    c = parameter_counts(model)
    return (f"LoRA: training {c['trainable']:,} of {c['total']:,} parameters ({100 * c['trainable'] / c['total']:.2f}%): "
            f"adapter {c['adapter']:,} + offset table {c['table']:,}")


def _base_state(lm_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The HF model's own weights from an injected model's state dict (LoRA layers name them base_layer)."""
    return {k.replace(".base_layer.", "."): v for k, v in lm_state.items() if "lora_" not in k}


FINGERPRINT_SAMPLES = 64
# A base loaded in bfloat16 or float16 (sampling does) rounds values to ~3 significant digits; a
# different base -- another seed, another fine-tune -- differs in the first.
FINGERPRINT_RTOL = 2e-2


def _fingerprint_names(state: dict[str, torch.Tensor], input_key: str | None) -> list[str]:
    """The tensors fingerprinted: the input embedding and the first and last other matrices by name."""
    matrices = sorted(k for k, v in state.items() if v.dim() == 2 and k != input_key)
    names = ([input_key] if input_key in state else []) + matrices[:1] + matrices[-1:]
    return list(dict.fromkeys(names))


def _tensor_print(t: torch.Tensor) -> dict[str, Any]:
    flat = t.detach().reshape(-1).to("cpu", torch.float64)
    step = max(1, flat.numel() // FINGERPRINT_SAMPLES)
    return {"shape": list(t.shape), "sample": flat[::step][:FINGERPRINT_SAMPLES].tolist(), "abs_mean": float(flat.abs().mean())}


def base_fingerprint(state: dict[str, torch.Tensor], input_key: str | None) -> dict[str, Any]:
    """A fingerprint of a base model's weights ``state`` (HF names): per named tensor its shape, 64
    values at a fixed stride and its mean absolute value. Not a hash: it must match the same base
    loaded in another dtype."""
    return {name: _tensor_print(state[name]) for name in _fingerprint_names(state, input_key)}


def _close(a: float, b: float, scale: float) -> bool:
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= FINGERPRINT_RTOL * (abs(b) + scale)


def check_base_fingerprint(state: dict[str, torch.Tensor], recorded: dict[str, Any], adapter: str, base: str) -> None:
    """Refuse a base whose weights are not those the adapter was trained on (one line naming both)."""
    for name, want in recorded.items():
        if name not in state:
            raise CheckpointError(f"the LoRA adapter {adapter} was trained on a base with tensor {name!r}, which the base "
                                  f"{base} lacks: it is another model; load the adapter onto its own base")
        have = _tensor_print(state[name])
        if have["shape"] != want["shape"]:
            raise CheckpointError(f"the LoRA adapter {adapter} was trained on a base whose {name} is {want['shape']}, but "
                                  f"the base {base} has {have['shape']}: another model shape; load the adapter onto its own base")
        scale = want["abs_mean"]
        if not (_close(have["abs_mean"], want["abs_mean"], 0.0) and
                all(_close(a, b, scale) for a, b in zip(have["sample"], want["sample"]))):
            raise CheckpointError(f"the LoRA adapter {adapter} was trained on another base than {base} (its weights "
                                  f"{name} differ from the fingerprint in its rpt_config.json); merging onto it would give a "
                                  "model nobody trained: load the adapter onto the base it was trained on")


def save_lora_checkpoint(model, path: str, section: dict[str, Any], base: str | None,
                         state_dict: dict[str, torch.Tensor] | None = None, final_path: str | None = None) -> None:
    """Write the adapter directory (see the module docstring) into ``path``.

    ``base``: the base model's id or path (``None``: a from-config model, saved to ``base/``).
    ``state_dict`` (keys as in ``model.state_dict()``): gathered ZeRO-3 weights. ``final_path``: where
    ``path`` will be renamed to (an atomic write), for the adapter config's absolute base path.
    """
    from peft import get_peft_model_state_dict  # late: peft is an optional dependency (LoRA runs only)

    if state_dict is None:
        state_dict = model.state_dict()
    lm_state = {k[len("lm."):]: v for k, v in state_dict.items() if k.startswith("lm.")}
    input_key = module_key(model.lm, model.lm.get_input_embeddings())
    adapter = get_peft_model_state_dict(model.lm, state_dict=lm_state, adapter_name="default")
    empty = [k for k, v in adapter.items() if v.numel() == 0]
    if not adapter or empty:
        raise RuntimeError(f"the LoRA adapter to save is empty ({empty[:3] or 'no tensors'}): the weights were not "
                           "gathered (ZeRO-3 saves need accelerator.get_state_dict on every rank)")
    os.makedirs(path, exist_ok=True)
    save_file({_PREFIX + k: v.detach().cpu().contiguous() for k, v in adapter.items()}, os.path.join(path, ADAPTER_WEIGHTS),
              metadata={"format": "pt"})
    config = lora_config(section)
    if base is None:  # a from-config base: its frozen weights go beside the adapter
        model.lm.save_pretrained(os.path.join(path, BASE_SUBDIR), state_dict=_base_state(lm_state))
        base_ref = BASE_SUBDIR
        config.base_model_name_or_path = os.path.abspath(os.path.join(final_path or path, BASE_SUBDIR))
    else:
        base_ref = config.base_model_name_or_path = base
    config.save_pretrained(path)
    table = state_dict["offset_embedding.weight"]
    save_table({"offset_embedding.weight": table.detach().cpu().contiguous()}, path)
    with open(os.path.join(path, RPT_CONFIG_NAME), "w") as f:
        fingerprint = base_fingerprint(_base_state(lm_state), input_key)
        json.dump({"window": model.window, "offset_rows": offset_rows(model.window), "format_version": RPT_FORMAT_VERSION,
                   "ntp_row_folded": False, **model.objective_record(),
                   "lora": {"base": base_ref, **section, "base_fingerprint": fingerprint}}, f, indent=2)


def load_lora(path: str, rpt_config, window: int | None = None, **hf_kwargs):
    """An adapter directory (``rpt_config``: its checked :class:`~rpt.checkpoint.rpt_config.RPTConfig`) as an
    :class:`~rpt.model.RPTForCausalLM` with the adapter merged in, once its base is checked to be
    the one it was trained on."""
    try:
        from peft import PeftModel
    except ImportError:
        raise ImportError(f"{path} is a LoRA checkpoint; loading it needs peft: pip install peft") from None

    base_ref = rpt_config.lora["base"]
    base_path = os.path.join(path, base_ref) if base_ref == BASE_SUBDIR else base_ref
    try:  # a missing local base named as such, not as transformers' "Repo id must be in the form ..."
        base_path = resolve_model_ref(base_path, f"the base model of the LoRA adapter {path} (its {RPT_CONFIG_NAME} "
                                      "key 'lora.base')", "put the base model there (or the adapter beside its run's "
                                      "final/base/), then load the adapter again")
    except ModelRefError as e:
        raise CheckpointError(str(e)) from None
    base = load_causal_lm(base_path, **hf_kwargs)
    recorded = rpt_config.lora.get("base_fingerprint")
    if isinstance(recorded, dict):
        check_base_fingerprint(base.state_dict(), recorded, path, base_path)
    try:
        merged = PeftModel.from_pretrained(base, path).merge_and_unload()
    except RuntimeError as e:  # an adapter from before fingerprints, for another base shape
        first = str(e).strip().splitlines()
        detail = next((line.strip() for line in first if "size mismatch" in line), first[0] if first else type(e).__name__)
        raise CheckpointError(f"the LoRA adapter {path} does not fit the base {base_path} ({detail[:200]}): it was trained "
                              "on another model; load it onto its own base") from None
    return RPTForCausalLM.attach_table(merged, path, window)


def merge(adapter_dir: str, out_dir: str) -> str:
    """Write ``adapter_dir`` merged into its base as a full faithful RPT checkpoint (atomically)."""

    model = RPTForCausalLM.from_pretrained(adapter_dir)
    if not getattr(model, "merged_from_lora", False):
        raise ValueError(f"{adapter_dir} is not a LoRA checkpoint (no 'lora' in its rpt_config.json); it needs no merge")
    tmp = temp_dir_for(out_dir)
    clear_dir(tmp)
    model.save_pretrained(tmp)
    try:
        AutoTokenizer.from_pretrained(adapter_dir).save_pretrained(tmp)
    except (OSError, ValueError):
        pass  # an adapter trained without a saved tokenizer: the base's applies
    commit_dir(tmp, out_dir)
    return out_dir


register_checkpoint_loader("lora", load_lora)  # RPTForCausalLM.from_pretrained of an adapter directory
