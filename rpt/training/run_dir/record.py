"""The run's record, and what a later invocation of the same ``output_dir`` may change.

``config.yaml`` is written once, by the invocation that starts the run, and never rewritten;
``final/training_config.yaml`` describes the weights beside it. A resume may change only
:data:`RESUMABLE_KEYS` (``max_steps`` only upwards) and, keeping the global batch, the split's
:data:`SPLIT_KEYS` (:func:`check_split_change`); every invocation that trains appends a
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
from rpt.checkpoint.directories import checkpoint_dirs, write_json_atomic
from rpt.result_files import write_atomic
from rpt.training.config import ConfigError, TrainConfig, yaml_error_text

# Keys a resume may change: how long to train (upwards) and how often to log, evaluate and save.
# Plus how a step is executed, not what it computes: an OOM on resume is met by turning gradient
# checkpointing on, a GPU node by compiling the blocks (both tested equal to eager); still recorded per segment.
RESUMABLE_KEYS = ("max_steps", "eval_every", "save_every", "log_every", "keep_last", "report_to",
                  "gradient_checkpointing", "compile", "compile_backend")
# How the global batch is split into micro-batches: a resume may change these (micro_batch_size: auto
# searches again on a smaller GPU) when the checkpoint keys the objective's draws per sequence of the
# global batch, and the global batch stays what it was (check_split_change); a checkpoint keyed per
# micro-batch (written before) is resumed with the split it was trained with.
SPLIT_KEYS = ("global_batch_size", "micro_batch_size", "grad_accum")
# Where the run lives and how it is shown, not what is trained: never compared.
PLACE_KEYS = ("output_dir", "resume", "cache_dir", "plot", "project", "run_name")
CONFIG_RECORD = "config.yaml"
SEGMENTS = "segments.jsonl"


def _fresh_run_hint(cfg: TrainConfig) -> str:
    return f"to train with other settings start a new run (another output_dir than {cfg.output_dir})"


def _stated(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with an unset ``grad_accum`` as the 1 it means without ``global_batch_size`` (records
    written before ``grad_accum`` could be unset say 1)."""
    if config.get("grad_accum") is None and config.get("global_batch_size") is None:
        return {**config, "grad_accum": 1}
    return config


def config_differences(recorded: dict[str, Any], cfg: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """``{key: (recorded, now)}`` for every key whose value differs (place keys ignored; a key the
    record lacks, one added to rpt after it was written, cannot be compared)."""
    recorded, now = _stated(recorded), _stated(cfg.to_dict())
    keys = (set(recorded) & set(now)) - set(PLACE_KEYS)
    return {k: (recorded.get(k), now.get(k)) for k in sorted(keys) if recorded.get(k) != now.get(k)}


def check_resume(recorded: dict[str, Any], cfg: TrainConfig, step: int, where: str, finished: bool,
                 draws: str = "sequence") -> dict[str, tuple[Any, Any]]:
    """The resumable changes ``cfg`` makes to the config saved at ``step`` in ``where`` (whose
    objective's draws are keyed per ``draws``); a :class:`ConfigError` for any other change, for
    ``max_steps`` at or below ``step`` or lowered, and for re-entering a finished run."""
    if cfg.draws is not None and cfg.draws != draws:
        raise ConfigError(f"config key 'draws' = {cfg.draws!r}, but {where} keyed the objective's draws per {draws}: a "
                          f"resume continues with the checkpoint's keying; set draws: {draws} (or leave it unset), or "
                          f"{_fresh_run_hint(cfg)}")
    # the keying is compared with the checkpoint's own (above), not with the record: unset means "the checkpoint's"
    changed = {k: v for k, v in config_differences(recorded, cfg).items() if k != "draws"}
    resumable = RESUMABLE_KEYS + (SPLIT_KEYS if draws == "sequence" else ())
    fixed = [k for k in changed if k not in resumable]
    if fixed and set(fixed) <= set(SPLIT_KEYS):
        shown = ", ".join(f"{k} ({changed[k][0]!r} -> {changed[k][1]!r})" for k in fixed)
        raise ConfigError(f"{where} keys the objective's permutations per micro-batch (it was written before they were "
                          f"keyed per sequence), so its split decides what is trained: {shown}; resume it with the "
                          f"micro_batch_size and grad_accum it was trained with")
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
    return {k: v for k, v in changed.items() if k in resumable}


def check_split_change(where: str, state: dict[str, Any], changed: dict[str, tuple[Any, Any]], global_batch: int) -> None:
    """A resume that changes how the global batch is split (:data:`SPLIT_KEYS`) must keep the global batch
    of the checkpoint ``where`` (its ``trainer_state.json`` is ``state``; ``global_batch``: this run's)."""
    split = [k for k in SPLIT_KEYS if k in changed]
    before = state.get("global_batch")
    if split and before is not None and before != global_batch:
        shown = ", ".join(f"{k} ({changed[k][0]!r} -> {changed[k][1]!r})" for k in split)
        raise ConfigError(f"{where} trained {before} sequences per step; {shown} would make it {global_batch}: a resume "
                          f"may change the split, not the global batch (set global_batch_size={before}), or "
                          "start a new run (another output_dir) to train with another batch")


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
    # nothing was trained yet: a new micro-batch (after an out-of-memory error, say) changes nothing
    fixed = [k for k in changed if k not in RESUMABLE_KEYS + ("micro_batch_size", "grad_accum")]
    if fixed:
        raise ConfigError(f"{os.path.join(cfg.output_dir, CONFIG_RECORD)} records a run with other settings "
                          f"({', '.join(fixed[:6])}); {_fresh_run_hint(cfg)}, or delete that output_dir")
    return changed


def write_config_record(cfg: TrainConfig) -> None:
    """``config.yaml``, written by the invocation that starts the run and never again."""
    path = os.path.join(cfg.output_dir, CONFIG_RECORD)
    if os.path.exists(path):
        return
    write_atomic(path, yaml.safe_dump(cfg.to_dict(), sort_keys=False))


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
                   checkpoint: str | None = None, split: dict[str, Any] | None = None) -> None:
    """Record that this invocation trains from ``start_step`` (resuming ``checkpoint``, possibly of
    another output_dir) to ``cfg.max_steps`` with ``changed`` keys (``{key: (before, now)}``) and
    ``split`` (the micro-batch and accumulation it runs, how an automatic one was chosen, the keying of
    the objective's draws), rewriting ``segments.jsonl`` atomically with the line added."""
    segments = read_segments(cfg.output_dir)
    segments.append({"segment": len(segments), "from_step": start_step,
                     "from_checkpoint": os.path.abspath(checkpoint) if checkpoint else None, "max_steps": cfg.max_steps,
                     "changed": {k: {"from": a, "to": b} for k, (a, b) in changed.items()}, **(split or {}),
                     "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    path = os.path.join(cfg.output_dir, SEGMENTS)
    write_atomic(path, "".join(json.dumps(s, default=str) + "\n" for s in segments))


def copy_segments(output_dir: str, target: str) -> None:
    """The run's segments beside ``final/``'s weights (``final/segments.json``)."""
    write_json_atomic(os.path.join(target, "segments.json"), read_segments(output_dir))
