"""A run's checkpoints: saved atomically, restored on resume, and ``final/`` at the end.

``checkpoint-<step>/`` holds accelerate's state, the data position (per rank for streams), the
scheduler as JSON and ``trainer_state.json``, with ``manifest.json`` written last
(:mod:`rpt.checkpoint.directories`); :func:`restore` loads what :func:`rpt.training.run_dir.resume.plan_start`
already verified. ``final/`` is a loadable RPT checkpoint (or LoRA adapter directory) with the
tokenizer, the config and the run's segments.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import shutil
from typing import Any

import yaml

from rpt.checkpoint.directories import (
    LEGACY_SCHEDULER_STATE,
    CheckpointError,
    check_plain_files,
    clear_dir,
    commit_dir,
    latest_checkpoint,
    load_data_state,
    load_scheduler_state,
    prune_checkpoints,
    save_data_state,
    save_scheduler_state,
    temp_dir_for,
    write_json_atomic,
    write_manifest,
)
from rpt.model.lora import save_lora_checkpoint
from rpt.training.config import TrainConfig
from rpt.training.measure.metrics import MetricsLog
from rpt.training.run_dir.record import copy_segments
from rpt.training.run_dir.resume import Start


def load_accelerator_state(accelerator, path: str) -> None:
    """``accelerator.load_state(path)``. A checkpoint written before the scheduler was JSON holds
    its state in ``custom_checkpoint_0.pkl``, which accelerate would unpickle without restriction;
    nothing is registered for it, so accelerate refuses the folder -- after loading everything
    else, as its last check -- and the scheduler is read from it as plain data instead."""
    try:
        accelerator.load_state(path)
    except RuntimeError as e:
        legacy = os.path.exists(os.path.join(path, LEGACY_SCHEDULER_STATE))
        if not (legacy and "Number of custom checkpoints" in str(e)):
            raise


def restore(accelerator, cfg: TrainConfig, start: Start, train, scheduler, metrics_log: MetricsLog,
            global_batch: int) -> tuple[int, int]:
    """Load the checkpoint ``start`` names (already verified and checked against the config by
    :func:`rpt.training.run_dir.resume.plan_start`); returns its step and ``data_position`` (samples read so far;
    ``(0, 0)``: no checkpoint). ``global_batch``: this run's sequences per step, said beside the checkpoint's."""
    path, state = start.checkpoint, start.state
    if not path:
        if accelerator.is_main_process and os.path.exists(metrics_log.path):
            os.remove(metrics_log.path)
        return 0, 0
    if not start.verified:
        if accelerator.is_main_process:
            print(f"note: {path} was written before checkpoints carried manifest.json: its files are not verified "
                  "against hashes; each is read as plain data")
        check_plain_files(path)  # a hostile or damaged pickle refused by name before accelerate reads it
    # Before load_state: a mismatch in the data is one line, not an error deep in a loader.
    data_state = load_data_state(path, accelerator.process_index, accelerator.num_processes)
    if data_state:
        train.load_state_dict(data_state)
    from safetensors import SafetensorError

    try:
        load_accelerator_state(accelerator, path)
    except (pickle.UnpicklingError, SafetensorError, RuntimeError, KeyError, OSError, EOFError, ValueError) as e:
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: its model or optimizer state cannot be loaded into this run ({first}); "
                              "resume from another checkpoint or resume=none") from None
    # accelerate restores its count of micro-batches, which decides where accumulate() syncs: counted
    # under the split that wrote the checkpoint, it would end this run's first steps off their
    # boundaries when the accumulation changed (a resume with another micro-batch or process count).
    accelerator.step = 0
    load_scheduler_state(path, scheduler)
    step, position = int(state["step"]), int(state["data_position"])
    train.resume_at(step, position)  # a token store continues at the next unread sample
    if accelerator.is_main_process:
        metrics_log.truncate_after(step)
        print(f"resumed from {path} at step {step} (data position {position})")
        old_batch, batch = state.get("global_batch"), global_batch
        if old_batch is not None and old_batch != batch:
            print(f"the global batch changed from {old_batch} to {batch} samples (world size "
                  f"{state.get('world_size')} -> {accelerator.num_processes}): continuing at sample {position}")
    return step, position


def write_failure(exc: BaseException) -> str | None:
    """The cause, in a few words, of a write that failed (a full disk, a quota, a read-only file
    system: an ``OSError``, torch's ``file write failed`` or safetensors' ``IoError``); None for an
    error that is not about writing."""
    from safetensors import SafetensorError

    if isinstance(exc, OSError):
        return os.strerror(exc.errno) if exc.errno else (str(exc) or type(exc).__name__)
    text = str(exc)
    if isinstance(exc, SafetensorError) or (isinstance(exc, RuntimeError) and "write" in text.lower()):
        for code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO):  # a Rust or C++ message holding an errno
            if f"os error {code}" in text or f"code: {code}," in text or os.strerror(code) in text:
                return os.strerror(code)
        return text.strip().splitlines()[0][:200] if text.strip() else type(exc).__name__
    return None


@contextlib.contextmanager
def written_whole(tmp: str, final_path: str, output_dir: str, main: bool):
    """Writing ``tmp`` (renamed to ``final_path`` when complete): a failed write (see :func:`write_failure`)
    removes ``tmp`` and is one :class:`CheckpointError` naming the path and the cause; the checkpoints
    already written are left as they were."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 -- only a failed write is answered here; anything else is re-raised
        cause = write_failure(e)
        if cause is None:
            raise
        if main:
            shutil.rmtree(tmp, ignore_errors=True)  # the half-written copy, which also frees the space it took
        kept = latest_checkpoint(output_dir)
        raise CheckpointError(f"could not write {final_path} ({cause}); {f'the previous checkpoint {kept} is intact' if kept else 'no earlier checkpoint exists'}"
                              f": free space in {output_dir} (or lower keep_last), then resume") from None


def save_checkpoint(accelerator, cfg: TrainConfig, step: int, data_position: int, scheduler,
                    data_state: dict | None = None, split: dict[str, Any] | None = None) -> None:
    final_path = os.path.join(cfg.output_dir, f"checkpoint-{step}")
    tmp = temp_dir_for(final_path)
    with written_whole(tmp, final_path, cfg.output_dir, accelerator.is_main_process):
        _save_checkpoint(accelerator, cfg, step, data_position, scheduler, tmp, final_path, data_state, split)
    if accelerator.is_main_process:
        prune_checkpoints(cfg.output_dir, cfg.keep_last)
    accelerator.wait_for_everyone()


def _save_checkpoint(accelerator, cfg: TrainConfig, step: int, data_position: int, scheduler, tmp: str,
                     final_path: str, data_state: dict | None, split: dict[str, Any] | None) -> None:
    if accelerator.is_main_process:
        clear_dir(tmp)
    accelerator.wait_for_everyone()
    accelerator.save_state(tmp)
    save_data_state(tmp, accelerator.process_index, data_state or {})
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        write_json_atomic(os.path.join(tmp, "trainer_state.json"), {
            "step": step, "data_position": data_position, "world_size": accelerator.num_processes,
            "global_batch": cfg.global_batch(accelerator.num_processes), **(split or {}),
            "data_workers": cfg.data_workers, "config": cfg.to_dict(),
        })
        save_scheduler_state(tmp, scheduler)
        write_manifest(tmp)  # last: the hash of every file, verified before a resume reads any
        commit_dir(tmp, final_path)


def save_final(accelerator, model, tokenizer, cfg: TrainConfig) -> None:
    """``final/``: a loadable RPT checkpoint (HF directory + table + tokenizer + config)."""
    final_path = os.path.join(cfg.output_dir, "final")
    tmp = temp_dir_for(final_path)
    state = accelerator.get_state_dict(model)  # gathers ZeRO-3 shards; every rank must call it
    if accelerator.is_main_process:
        with written_whole(tmp, final_path, cfg.output_dir, True):
            _save_final(accelerator, model, tokenizer, cfg, state, tmp, final_path)
    accelerator.wait_for_everyone()


def _save_final(accelerator, model, tokenizer, cfg: TrainConfig, state, tmp: str, final_path: str) -> None:
    clear_dir(tmp)
    if cfg.lora is not None:
        save_lora_checkpoint(accelerator.unwrap_model(model), tmp, cfg.lora, lora_base(cfg), state, final_path)
    else:
        accelerator.unwrap_model(model).save_pretrained(tmp, state_dict=state)
    tokenizer.save_pretrained(tmp)
    with open(os.path.join(tmp, "training_config.yaml"), "w") as f:
        yaml.safe_dump(cfg.to_dict(), f, sort_keys=False)
    copy_segments(cfg.output_dir, tmp)  # how these weights were trained: each invocation's steps and changes
    commit_dir(tmp, final_path)


def lora_base(cfg: TrainConfig) -> str | None:
    """What a LoRA adapter's base is: the model's id or (absolute) path; None for a from-config model."""
    source = cfg.init_from or cfg.model
    if not isinstance(source, str):
        return None
    return os.path.abspath(source) if os.path.isdir(source) else source
