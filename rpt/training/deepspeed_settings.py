"""The run's config is the truth for DeepSpeed: precision, clipping, micro-batch, accumulation.

A DeepSpeed JSON may leave these ``"auto"`` (the shipped ones do) and they are set from the run's
config; a value the JSON pins that disagrees with the config is one :class:`ConfigError` naming
both -- never a run that silently trains in another precision or with another clipping. After
``accelerate.prepare`` :func:`engine_precision` reads back what the engine actually runs.
"""

from __future__ import annotations

from typing import Any

from rpt.training.config import ConfigError, TrainConfig
from rpt.training.micro_batch import Split


def wanted(cfg: TrainConfig, split: Split, world_size: int) -> dict[str, tuple[Any, str]]:
    """DeepSpeed key (dotted) -> (value the run's config and split imply, the config key that sets it)."""
    return {
        "bf16.enabled": (cfg.precision == "bf16", "precision"),
        "fp16.enabled": (cfg.precision == "fp16", "precision"),
        # 0 is DeepSpeed's "no clipping", as max_grad_norm: 0 is ours.
        "gradient_clipping": (float(cfg.max_grad_norm), "max_grad_norm"),
        "train_micro_batch_size_per_gpu": (split.micro, "micro_batch_size"),
        "gradient_accumulation_steps": (split.accum, "grad_accum"),
        "train_batch_size": (split.global_batch(world_size), "global_batch_size" if cfg.global_batch_size
                             else "micro_batch_size x grad_accum x processes"),
    }


def _same(have: Any, want: Any) -> bool:
    if isinstance(want, bool):
        return str(have).lower() == str(want).lower()
    try:
        return float(have) == float(want)
    except (TypeError, ValueError):
        return False


def apply_run_config(ds_config: dict[str, Any], cfg: TrainConfig, split: Split, world_size: int) -> None:
    """Set ``ds_config`` (in place) from ``cfg`` and the run's ``split``. accelerate has already filled the ``"auto"``
    precision and accumulation from the Accelerator's arguments, which come from ``cfg``: a
    value that disagrees was pinned by the JSON file."""
    for dotted, (want, key) in wanted(cfg, split, world_size).items():
        section, _, name = dotted.rpartition(".")
        node = ds_config.setdefault(section, {}) if section else ds_config
        have = node.get(name)
        if have not in (None, "auto") and not _same(have, want):
            raise ConfigError(f"the DeepSpeed config sets {dotted}={have!r} but the run's config key {key!r} asks for "
                              f"{want!r}; set {dotted} to \"auto\" in the DeepSpeed JSON (the run's config then decides) "
                              f"or change {key}")
        node[name] = want


def check_deepspeed_batch(ds_config: dict[str, Any], cfg: TrainConfig) -> None:
    """Before any work: a DeepSpeed JSON that pins the micro-batch where the run's config chooses it
    (``micro_batch_size: auto``), or a batch size other than ``global_batch_size``, is one error."""
    pinned = {k: ds_config.get(k) for k in ("train_micro_batch_size_per_gpu", "train_batch_size")
              if ds_config.get(k) not in (None, "auto")}
    if cfg.micro_batch_size == "auto" and "train_micro_batch_size_per_gpu" in pinned:
        have = pinned["train_micro_batch_size_per_gpu"]
        raise ConfigError(f"the DeepSpeed config sets train_micro_batch_size_per_gpu={have!r} but micro_batch_size is auto "
                          f"(the run chooses it); set it to \"auto\" in the DeepSpeed JSON, or micro_batch_size: {have}")
    if cfg.global_batch_size is not None and "train_batch_size" in pinned and not _same(pinned["train_batch_size"], cfg.global_batch_size):
        raise ConfigError(f"the DeepSpeed config sets train_batch_size={pinned['train_batch_size']!r} but global_batch_size is "
                          f"{cfg.global_batch_size}; set it to \"auto\" in the DeepSpeed JSON (the run's config then decides) "
                          "or change global_batch_size")


def engine_precision(engine) -> str:
    """The precision a prepared DeepSpeed engine trains in: fp32, bf16 or fp16."""
    if engine.bfloat16_enabled():
        return "bf16"
    return "fp16" if engine.fp16_enabled() else "fp32"
