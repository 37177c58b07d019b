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
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

LORA_KEYS = {"r": int, "alpha": (int, float), "dropout": (int, float), "target_modules": (list, str)}
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
BASE_SUBDIR = "base"
_PREFIX = "base_model.model."  # PEFT's key prefix in a saved adapter (PeftModel -> LoraModel -> model)


def check_section(section: Any) -> str | None:
    """The problem with a config's ``lora:`` mapping, or None when it is fine."""
    if not isinstance(section, dict):
        return "use a mapping, e.g. lora: {r: 8, alpha: 16, dropout: 0.05, target_modules: [q_proj, v_proj]}"
    unknown = sorted(set(section) - set(LORA_KEYS))
    if unknown:
        return f"unknown key {unknown[0]!r}; known: {', '.join(LORA_KEYS)}"
    for key, typ in LORA_KEYS.items():
        if key in section and (not isinstance(section[key], typ) or isinstance(section[key], bool)):
            return f"{key} has the wrong type ({section[key]!r})"
    if int(section.get("r", 8)) < 1:
        return "r must be an integer >= 1"
    if not 0 <= float(section.get("dropout", 0.0)) < 1:
        return "dropout must be in [0, 1)"
    if float(section.get("alpha", 16)) <= 0:
        return "alpha must be > 0"
    targets = section.get("target_modules", "all-linear")
    if isinstance(targets, list) and not (targets and all(isinstance(t, str) and t for t in targets)):
        return "target_modules must be a non-empty list of module names or 'all-linear'"
    return None


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


def save_lora_checkpoint(model, path: str, section: dict[str, Any], base: str | None,
                         state_dict: dict[str, torch.Tensor] | None = None, final_path: str | None = None) -> None:
    """Write the adapter directory (see the module docstring) into ``path``.

    ``base``: the base model's id or path (``None``: a from-config model, saved to ``base/``).
    ``state_dict`` (keys as in ``model.state_dict()``): gathered ZeRO-3 weights. ``final_path``: where
    ``path`` will be renamed to (an atomic write), for the adapter config's absolute base path.
    """
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    from rpt.model import RPT_CONFIG_NAME, RPT_FORMAT_VERSION, offset_rows, save_table

    if state_dict is None:
        state_dict = model.state_dict()
    lm_state = {k[len("lm."):]: v for k, v in state_dict.items() if k.startswith("lm.")}
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
        json.dump({"window": model.window, "offset_rows": offset_rows(model.window), "format_version": RPT_FORMAT_VERSION,
                   "ntp_row_folded": False, "lora": {"base": base_ref, **section}}, f, indent=2)


def is_lora_checkpoint(rpt_config: dict[str, Any]) -> bool:
    return isinstance(rpt_config.get("lora"), dict)


def load_lora(path: str, rpt_config: dict[str, Any], window: int | None = None, **hf_kwargs):
    """An adapter directory as an :class:`~rpt.model.RPTForCausalLM` with the adapter merged in."""
    try:
        from peft import PeftModel
    except ImportError:
        raise ImportError(f"{path} is a LoRA checkpoint; loading it needs peft: pip install peft") from None
    from transformers import AutoModelForCausalLM

    from rpt.model import RPTForCausalLM

    base_ref = rpt_config["lora"]["base"]
    base_path = os.path.join(path, base_ref) if base_ref == BASE_SUBDIR else base_ref
    base = AutoModelForCausalLM.from_pretrained(base_path, **hf_kwargs)
    merged = PeftModel.from_pretrained(base, path).merge_and_unload()
    return RPTForCausalLM.attach_table(merged, path, window)


def merge(adapter_dir: str, out_dir: str) -> str:
    """Write ``adapter_dir`` merged into its base as a full faithful RPT checkpoint (atomically)."""
    from transformers import AutoTokenizer

    from rpt.checkpointing import clear_dir, commit_dir, temp_dir_for
    from rpt.model import RPTForCausalLM

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
