"""Building a run: the accelerator, the model, the optimizer and its schedule (a warmup longer than the
run fitted to it), the backend's checks.

Everything :func:`rpt.training.loop.run` makes before its first step, and the DeepSpeed and precision
checks that refuse a backend the config cannot run, before any data or model is built.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from rpt.checkpoint.rpt_config import read_rpt_config
from rpt.model import RPTForCausalLM
from rpt.model.lora import add_lora
from rpt.training.compiled_blocks import compile_blocks
from rpt.training.config import ConfigError, TrainConfig
from rpt.training.deepspeed_settings import apply_run_config, check_deepspeed_batch, engine_precision
from rpt.training.micro_batch import Split

PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}


def make_accelerator(cfg: TrainConfig):
    from accelerate import Accelerator

    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false") != "true":
        import accelerate.utils.other

        # accelerate's unwrap_model imports deepspeed whenever it is installed, only to isinstance-check
        # for a DeepSpeed engine that a run without DeepSpeed never has: the import costs ~0.7 s and
        # prints "Setting accelerator to CPU" on every CPU run.
        accelerate.utils.other.is_deepspeed_available = lambda: False
    return Accelerator(
        # Without an accelerator device, accelerate only forms a multi-process (gloo) group when
        # told it runs on the CPU; with cpu=False each torchrun worker would train alone.
        cpu=not torch.accelerator.is_available() and os.environ.get("ACCELERATE_USE_DEEPSPEED", "false") != "true",
        mixed_precision=PRECISION[cfg.precision],
        gradient_accumulation_steps=1,  # set to the split's once it is chosen (rpt.training.micro_batch)
        log_with=None if cfg.report_to == "none" else cfg.report_to,
        project_dir=cfg.output_dir,
    )


def zero_stage(accelerator) -> int:
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return int(plugin.zero_stage) if plugin is not None else 0


def check_backend(accelerator, cfg: TrainConfig) -> None:
    """Settings the distributed backend cannot run, refused before any data or model is built."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if getattr(plugin, "deepspeed_config", None) is not None:
        check_deepspeed_batch(plugin.deepspeed_config, cfg)
    if zero_stage(accelerator) == 3 and cfg.compile:
        # ZeRO-3 gathers each block's parameters in Python hooks around the block's forward, which
        # a compiled block would have to trace; DeepSpeed compiles those through its own engine.
        raise ConfigError("config key 'compile' = True does not run under DeepSpeed ZeRO-3 (its parameter-gathering "
                          "hooks run inside every compiled block); use ZeRO-2 or DDP with compile: true, or compile: false")


def build_model(cfg: TrainConfig, tokenizer) -> RPTForCausalLM:
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_kwargs: dict[str, Any] = {}
    if cfg.attn_implementation:
        hf_kwargs["attn_implementation"] = cfg.attn_implementation
    source = cfg.init_from or cfg.model
    if isinstance(source, dict):
        spec = dict(source)
        model_type = spec.pop("model_type")
        spec.setdefault("vocab_size", len(tokenizer))
        for name in ("eos_token_id", "bos_token_id", "pad_token_id"):
            spec.setdefault(name, getattr(tokenizer, name, None))
        config = AutoConfig.for_model(model_type, **spec)
        base = AutoModelForCausalLM.from_config(config, **hf_kwargs)
        model = RPTForCausalLM.from_base(base, cfg.window)
    elif os.path.isdir(str(source)) and read_rpt_config(source) is not None:  # checked: one reader of rpt_config.json
        # LoRA keeps the base as saved (folded, untied): its adapter's table is stored relative to it
        model = RPTForCausalLM.from_pretrained(source, window=cfg.window, retie=cfg.lora is None, **hf_kwargs)
        if model.window != cfg.window:
            raise ValueError(
                f"init_from {source} was trained with window {model.window} but the config asks for window "
                f"{cfg.window}; set window={model.window}"
            )
    else:
        model = RPTForCausalLM.from_pretrained(source, window=cfg.window, **hf_kwargs)
    if len(tokenizer) > model.lm.get_input_embeddings().num_embeddings:
        if cfg.lora is not None:
            # The adapter directory does not hold the base embedding, so new rows would be lost.
            raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the base model's embedding "
                             f"{model.lm.get_input_embeddings().num_embeddings}; LoRA keeps the base frozen: use the "
                             "base model's tokenizer (tokenizer: null) or fine-tune without lora")
        model.lm.resize_token_embeddings(len(tokenizer))
    model.objective = cfg.objective  # recorded in rpt_config.json: RPT decoding needs "rpt"
    if cfg.lora is not None:
        add_lora(model, cfg.lora)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if cfg.compile:  # after checkpointing: each compiled block holds its own recomputation
        compile_blocks(model, cfg.compile_backend)
    model.loss_chunk_bytes = cfg.loss_chunk_mb << 20
    return model


def optimizer_kernel(device: torch.device | str | None) -> dict[str, bool]:
    """AdamW's implementation for parameters on ``device``: torch's fused kernel (the whole update in
    one kernel per dtype and device) where torch has one for that device -- CUDA, and the CPU, where
    it is also 7x faster than foreach -- else the foreach one (a few multi-tensor ops). The same
    update either way."""
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    kind = torch.device(device).type if device is not None else "cpu"
    return {"fused": True} if kind in _get_fused_kernels_supported_devices() else {"foreach": True}


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device | str | None = None) -> torch.optim.Optimizer:
    """AdamW for ``model``, whose parameters train on ``device`` (default: where they are now)."""
    # Matrices decay; biases, norms and the offset table (a positional embedding) do not.
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 and "offset_embedding" not in name else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if device is None:
        device = next(model.parameters()).device
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), **optimizer_kernel(device))


def fit_warmup(cfg: TrainConfig) -> tuple[TrainConfig, str | None]:
    """A warmup longer than the run shortened to the run (the rest of the schedule unchanged),
    with the line that says so; ``(cfg, None)`` when it fits."""
    if cfg.warmup_steps <= cfg.max_steps:
        return cfg, None
    import dataclasses

    note = (f"warmup_steps {cfg.warmup_steps} is longer than the run (max_steps {cfg.max_steps}): warming up over "
            f"all {cfg.max_steps} steps instead")
    return dataclasses.replace(cfg, warmup_steps=cfg.max_steps), note


def lr_lambda(cfg: TrainConfig):
    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" else 1 - progress
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * shape

    return factor


def configure_deepspeed(accelerator, cfg: TrainConfig, split: Split, model: RPTForCausalLM) -> None:
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if zero_stage(accelerator) == 3:
        import deepspeed

        # The loss reads the output head's weight outside the head's forward (rpt.model.loss): ZeRO-3
        # must gather it for the whole model's forward and backward.
        for p in model.lm.get_output_embeddings().parameters():
            deepspeed.zero.register_external_parameter(model, p)
    if plugin is not None:
        # The run's config decides precision, clipping, micro-batch and accumulation (the
        # shipped JSONs say "auto"); a JSON value that disagrees is one error, not a silent override.
        apply_run_config(plugin.deepspeed_config, cfg, split, accelerator.num_processes)


def trained_precision(accelerator, model) -> str:
    """The precision the prepared model actually trains in (``run`` refuses one other than the
    config's: config.yaml and the MFU would otherwise report the wrong one)."""
    if getattr(accelerator.state, "deepspeed_plugin", None) is not None:
        return engine_precision(model)
    return {v: k for k, v in PRECISION.items()}[str(accelerator.mixed_precision)]
