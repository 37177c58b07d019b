"""Checks run before any work: the output paths (:mod:`rpt.cli.output_paths`), trackers, model references and
device of a run.

Each problem is one :class:`~rpt.training.config.ConfigError` (``error: ...``, exit 2) naming the key or
flag and the fix -- raised before a tokenizer is trained, a model loaded or a token generated,
so a bad path never costs a run and nothing is left half-written.
"""

from __future__ import annotations

import os

from rpt.checkpoint.model_ref import ModelRefError, resolve_model_ref
from rpt.cli.devices import check_device
from rpt.cli.output_paths import check_output
from rpt.training.config import ConfigError, TrainConfig


def check_tracker(report_to: str) -> None:
    """``report_to`` names a tracker whose package is installed (else the run would log nowhere)."""
    if report_to == "none":
        return
    from accelerate.utils import is_tensorboard_available, is_wandb_available

    available = {"tensorboard": is_tensorboard_available, "wandb": is_wandb_available}[report_to]()
    if not available:
        package = "tensorboard" if report_to == "tensorboard" else "wandb"
        raise ConfigError(f"config key 'report_to' = {report_to!r} but the {package} package is not installed; "
                          f"pip install {package}, or set report_to=none")


def model_refs(cfg: TrainConfig) -> list[tuple[str, str, str]]:
    """``(config key, reference, fix for a missing path)`` of every model reference the run loads."""
    refs = []
    if cfg.init_from is not None:
        refs.append(("init_from", cfg.init_from, "train the run it names first (e.g. `python train.py --config "
                     "configs/tiny_pretrain.yaml` for configs/tiny_finetune.yaml), or point init_from at an "
                     "existing checkpoint's final/ directory"))
    elif isinstance(cfg.model, str):
        refs.append(("model", cfg.model, "give an existing model directory or a hub id"))
    if isinstance(cfg.tokenizer, str):
        refs.append(("tokenizer", cfg.tokenizer, "give an existing tokenizer directory, a hub id, or null for the "
                     "model's own"))
    return refs


def check_train_inputs(cfg: TrainConfig) -> None:
    """Everything a run needs that a config's validation cannot see: paths and packages."""
    check_output(cfg.output_dir, "config key 'output_dir'", ConfigError, directory=True)
    check_output(cfg.cache_dir, "config key 'cache_dir'", ConfigError, directory=True)
    check_tracker(cfg.report_to)
    check_model_refs(cfg)
    check_model_architecture(cfg)


def check_model_refs(cfg: TrainConfig) -> None:
    """``model`` / ``init_from`` / ``tokenizer`` name a directory or a loadable hub id; a local model
    directory holds a model (``config.json``) and, where the run takes its tokenizer from it, a tokenizer."""
    for key, ref, hint in model_refs(cfg):
        try:
            resolved = resolve_model_ref(ref, f"config key {key!r} =", hint)
        except ModelRefError as e:
            raise ConfigError(str(e)) from None
        if key in ("init_from", "model") and os.path.isdir(resolved):
            # the run's tokenizer comes from this directory unless named, or taken from a token store
            _check_model_dir(key, ref, resolved, needs_tokenizer=cfg.tokenizer is None
                             and not (isinstance(cfg.data, dict) and "tokens" in cfg.data))


def _model_config(cfg: TrainConfig):
    """The transformers config of the model the run builds, where it can be read without a download
    (a from-config spec, a local directory, a cached hub id); None otherwise."""
    from transformers import AutoConfig

    source = cfg.init_from or cfg.model
    try:
        if isinstance(source, dict):
            spec = dict(source)
            return AutoConfig.for_model(spec.pop("model_type"), **spec)
        return AutoConfig.from_pretrained(source, local_files_only=True)
    except Exception:  # unreadable here: building the model reports why, and wrapping checks the family again
        return None


def check_model_architecture(cfg: TrainConfig) -> None:
    """The model's family can be wrapped for RPT (:mod:`rpt.model.architectures`): an ALiBi model is refused
    before a tokenizer is trained or a weight read (the wrapper refuses it again when it is built)."""
    from rpt.model.architectures import architecture_refusal, causal_lm_class  # late: torch

    config = _model_config(cfg)
    if config is None:
        return
    reason = architecture_refusal(config, causal_lm_class(config))
    if reason is not None:
        key = "init_from" if cfg.init_from else "model"
        raise ConfigError(f"config key {key!r}: cannot train with RPT: {reason}")


def _check_model_dir(key: str, ref: str, path: str, needs_tokenizer: bool) -> None:
    if not os.path.isfile(os.path.join(path, "config.json")):
        training_state = os.path.isfile(os.path.join(path, "trainer_state.json"))
        raise ConfigError(f"config key {key!r} = {ref!r} is not a model directory (no config.json)"
                          + ("; it is a training checkpoint (its state, not a model): give the run's final/ directory, "
                             "or continue that run with resume=<checkpoint>" if training_state else
                             "; give a directory save_pretrained wrote (a run's final/)"))
    if needs_tokenizer and not any(os.path.isfile(os.path.join(path, n)) for n in ("tokenizer.json", "tokenizer_config.json")):
        raise ConfigError(f"config key {key!r} = {ref!r} holds no tokenizer (tokenizer.json), and config key 'tokenizer' "
                          "is null, so the run would take it from there; set tokenizer to one (an id or a directory)")


def check_train_device(flag: str = "--device") -> None:
    """The device a run was told to use (``train.py --device``, or accelerate's ``ACCELERATE_TORCH_DEVICE``)
    exists here; a one-process setting, since a launched process takes its own device."""
    name = os.environ.get("ACCELERATE_TORCH_DEVICE")
    if not name:
        return
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        raise ConfigError(f"{flag} {name!r} names the device of a one-process run, but this is process "
                          f"{os.environ.get('RANK', '?')} of {os.environ['WORLD_SIZE']}: each launched process takes its "
                          "own device; leave it out (CUDA_VISIBLE_DEVICES picks the GPUs)")
    try:
        check_device(name, flag)
    except ValueError as e:
        raise ConfigError(str(e)) from None
