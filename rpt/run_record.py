"""A run's record is history: what a later invocation of the same ``output_dir`` may change.

``config.yaml`` is written once, by the invocation that starts the run, and never rewritten;
``final/training_config.yaml`` describes the weights beside it. A resume may change only
:data:`RESUMABLE_KEYS` (``max_steps`` only upwards); every invocation that trains appends a
*segment* to ``segments.jsonl`` (the step it starts from and the keys it changed), so the record
says how the weights were trained. Any other difference from the checkpoint's saved config is
refused with one line naming the keys; a finished run is not re-entered.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import yaml

from rpt.append_log import LogLines, json_object, read_log, read_text_file
from rpt.checkpointing import checkpoint_dirs, write_json_atomic
from rpt.config import ConfigError, TrainConfig, yaml_error_text

# Keys a resume may change: how long to train (upwards) and how often to log, evaluate and save.
# Plus how a step is executed, not what it computes: an OOM on resume is met by turning gradient
# checkpointing on, a GPU node by compiling the blocks (both tested equal to eager); still recorded per segment.
RESUMABLE_KEYS = ("max_steps", "eval_every", "save_every", "log_every", "keep_last", "report_to",
                  "gradient_checkpointing", "compile", "compile_backend")
# Where the run lives and how it is shown, not what is trained: never compared.
PLACE_KEYS = ("output_dir", "resume", "cache_dir", "plot", "project", "run_name")
CONFIG_RECORD = "config.yaml"
SEGMENTS = "segments.jsonl"


def _fresh_run_hint(cfg: TrainConfig) -> str:
    return f"to train with other settings start a new run (another output_dir than {cfg.output_dir})"


def config_differences(recorded: dict[str, Any], cfg: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """``{key: (recorded, now)}`` for every key whose value differs (place keys ignored; a key the
    record lacks, one added to rpt after it was written, cannot be compared)."""
    now = cfg.to_dict()
    keys = (set(recorded) & set(now)) - set(PLACE_KEYS)
    return {k: (recorded.get(k), now.get(k)) for k in sorted(keys) if recorded.get(k) != now.get(k)}


def check_resume(recorded: dict[str, Any], cfg: TrainConfig, step: int, where: str, finished: bool) -> dict[str, tuple[Any, Any]]:
    """The resumable changes ``cfg`` makes to the config saved at ``step`` in ``where``; a
    :class:`ConfigError` for any other change, for ``max_steps`` at or below ``step`` or lowered,
    and for re-entering a finished run."""
    changed = config_differences(recorded, cfg)
    fixed = [k for k in changed if k not in RESUMABLE_KEYS]
    if fixed:
        shown = ", ".join(f"{k} ({changed[k][0]!r} -> {changed[k][1]!r})" for k in fixed[:6])
        raise ConfigError(f"{where} was trained with other settings: {shown}{' ...' if len(fixed) > 6 else ''}; a resume "
                          f"may change only {', '.join(RESUMABLE_KEYS)}; {_fresh_run_hint(cfg)}")
    if finished and cfg.max_steps == step:
        raise ConfigError(f"the run in {cfg.output_dir} is finished (final/ written at max_steps {step}); raise max_steps "
                          f"to train further, or {_fresh_run_hint(cfg)}")
    old_max = recorded.get("max_steps")
    if cfg.max_steps < step or (cfg.max_steps == step and finished):
        raise ConfigError(f"config key 'max_steps' = {cfg.max_steps} is at or below the step {step} of {where}; "
                          f"use max_steps > {step} to continue the run")
    if isinstance(old_max, int) and cfg.max_steps < old_max:
        raise ConfigError(f"config key 'max_steps' = {cfg.max_steps} is below the run's max_steps {old_max} "
                          f"({where}): its learning-rate schedule was planned for {old_max} steps; use max_steps >= {old_max}")
    return {k: v for k, v in changed.items() if k in RESUMABLE_KEYS}


def read_config_record(output_dir: str) -> dict[str, Any] | None:
    """The run's ``config.yaml`` (None where there is none)."""
    path = os.path.join(output_dir, CONFIG_RECORD)
    if not os.path.exists(path):
        return None
    text = read_text_file(path, "the run's record of how it started")
    try:
        recorded = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML ({yaml_error_text(e)}); it is the run's record: restore it or start "
                          "a new output_dir") from None
    if not isinstance(recorded, dict):
        raise ConfigError(f"{path} is not a mapping of config keys; it is the run's record: restore it or start a new output_dir")
    return recorded


def check_fresh_start(cfg: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """A start without a checkpoint: it must not overwrite another run's record."""
    if cfg.resume == "none" and (checkpoint_dirs(cfg.output_dir) or os.path.isdir(os.path.join(cfg.output_dir, "final"))):
        raise ConfigError(f"config key 'resume' = 'none' would start over in {cfg.output_dir}, which holds a run's "
                          f"checkpoints: resume=auto to continue it, or {_fresh_run_hint(cfg)}")
    recorded = read_config_record(cfg.output_dir)
    if recorded is None:
        return {}
    changed = config_differences(recorded, cfg)
    fixed = [k for k in changed if k not in RESUMABLE_KEYS]
    if fixed:
        raise ConfigError(f"{os.path.join(cfg.output_dir, CONFIG_RECORD)} records a run with other settings "
                          f"({', '.join(fixed[:6])}); {_fresh_run_hint(cfg)}, or delete that output_dir")
    return changed


def write_config_record(cfg: TrainConfig) -> None:
    """``config.yaml``, written by the invocation that starts the run and never again."""
    path = os.path.join(cfg.output_dir, CONFIG_RECORD)
    if os.path.exists(path):
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        yaml.safe_dump(cfg.to_dict(), f, sort_keys=False)
    os.replace(tmp, path)


SEGMENTS_ROLE = "the run's record of its invocations (segments.jsonl)"


def _segment(text: str) -> dict[str, Any]:
    segment = json_object(text)
    ints = [segment.get(k) for k in ("from_step", "max_steps")]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints):
        raise ValueError("not a segment (a JSON object with integers 'from_step' and 'max_steps')")
    return segment


def read_segments_log(output_dir: str) -> LogLines:
    """``segments.jsonl`` checked (:mod:`rpt.append_log`): a torn last line dropped, a damaged one named."""
    return read_log(os.path.join(output_dir, SEGMENTS), _segment, SEGMENTS_ROLE, keep_unterminated=True)


def read_segments(output_dir: str) -> list[dict[str, Any]]:
    return read_segments_log(output_dir).items


def append_segment(cfg: TrainConfig, start_step: int, changed: dict[str, tuple[Any, Any]],
                   checkpoint: str | None = None) -> None:
    """Record that this invocation trains from ``start_step`` (resuming ``checkpoint``, possibly of
    another output_dir) to ``cfg.max_steps`` with ``changed`` keys (``{key: (before, now)}``),
    rewriting ``segments.jsonl`` atomically with the line added."""
    segments = read_segments(cfg.output_dir)
    segments.append({"segment": len(segments), "from_step": start_step,
                     "from_checkpoint": os.path.abspath(checkpoint) if checkpoint else None, "max_steps": cfg.max_steps,
                     "changed": {k: {"from": a, "to": b} for k, (a, b) in changed.items()},
                     "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    path = os.path.join(cfg.output_dir, SEGMENTS)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(s, default=str) + "\n" for s in segments)
    os.replace(tmp, path)


def copy_segments(output_dir: str, target: str) -> None:
    """The run's segments beside ``final/``'s weights (``final/segments.json``)."""
    write_json_atomic(os.path.join(target, "segments.json"), read_segments(output_dir))
