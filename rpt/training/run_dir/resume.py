"""Where a run starts: the checkpoint to resume (verified and checked against the config) or none.

Decided before the data, the model or the optimizer is built, so a refused resume costs nothing
and writes nothing. The main process first takes the output directory's lock (:mod:`rpt.training.run_dir.lock`)
and checks the run's own files (:mod:`rpt.training.run_dir.file_checks`). Every process reaches the same decision:
the manifest is verified by the main process (hashing a large checkpoint once, not once per rank)
and its verdict broadcast, so no rank loads a checkpoint another refused (a rank left alone in a
collective would hang).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from rpt.checkpoint.directories import CheckpointError, latest_checkpoint, read_trainer_state, verify_manifest
from rpt.training.config import ConfigError, TrainConfig
from rpt.training.run_dir.file_checks import check_run_files
from rpt.training.run_dir.lock import take_run_lock
from rpt.training.run_dir.record import check_fresh_start, check_resume, check_split_change
from rpt.training.step import LEGACY_DRAWS


@dataclass
class Start:
    checkpoint: str | None  # None: train from step 0
    state: dict[str, Any] = field(default_factory=dict)  # its trainer_state.json
    changed: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # resumable keys this invocation changes
    verified: bool = False  # its files matched its manifest


def _checkpoint_path(cfg: TrainConfig) -> str | None:
    if cfg.resume == "none":
        return None
    return latest_checkpoint(cfg.output_dir) if cfg.resume == "auto" else cfg.resume


def _verify(path: str, deepspeed: bool) -> bool:
    if verify_manifest(path):
        return True
    if deepspeed:
        # DeepSpeed's engine unpickles its files with weights_only=False: unverified, they could run code.
        raise CheckpointError(f"{path} has no manifest.json (written before rpt recorded file hashes); DeepSpeed "
                              "unpickles checkpoint files without restriction, so it is not resumed unverified: "
                              "resume it without DeepSpeed once (every read there is weights_only), or resume=none")
    return False


def plan_start(cfg: TrainConfig, accelerator, deepspeed: bool) -> Start:
    """The checkpoint this run continues from, checked; a :class:`ConfigError` / :class:`CheckpointError`
    (one line naming the file or key) on every rank when it must not be resumed."""
    from accelerate.utils import broadcast_object_list

    path = _checkpoint_path(cfg)
    verdict: list[Any] = [None]
    if accelerator.is_main_process:
        try:
            take_run_lock(cfg.output_dir)  # one trainer per output_dir (rpt.training.run_dir.lock), before any file is read
            for note in check_run_files(cfg.output_dir):
                print(note, flush=True)
            verdict[0] = ("ok", _verify(path, deepspeed)) if path else ("ok", False)
        except ConfigError as e:
            verdict[0] = ("config", str(e))
        except (CheckpointError, OSError) as e:
            verdict[0] = ("error", str(e))
    if accelerator.num_processes > 1:
        broadcast_object_list(verdict)
    kind, value = verdict[0]
    if kind in ("config", "error"):
        raise (ConfigError if kind == "config" else CheckpointError)(value)
    if not path:
        return Start(None, changed=check_fresh_start(cfg))
    state = read_trainer_state(path)
    finished = os.path.isdir(os.path.join(cfg.output_dir, "final")) and state["step"] == state["config"].get("max_steps")
    # checkpoints that do not say how the objective's draws were keyed keyed them per micro-batch
    changed = check_resume(state["config"], cfg, state["step"], path, finished, state.get("draws", LEGACY_DRAWS))
    check_split_change(path, state, changed, cfg.global_batch(accelerator.num_processes))
    return Start(path, state, changed, verified=value)


def check_same_data(start: Start, data_key: str | None, train) -> None:
    """A checkpoint's ``data_position`` is a place in the tokens it was trained on (``data_key`` in its
    trainer_state.json, :meth:`rpt.data.token_store.TokenStore.content_key`): resumed over other tokens
    (a corpus rewritten since, whose store was prepared again), it would go on training on other data
    from there without a word, so it is refused, on every rank alike, before the model is prepared.
    Checkpoints written before they recorded the key, and streamed data (no key), resume as before.

    The key is read from the store's index; the shards' own bytes are checked against the stamps the
    checkpoint recorded (``data_files``, :meth:`rpt.data.token_store.TokenStore.check_unchanged`): a shard
    rewritten in place since, even to the same size, is hashed and refused when its tokens differ."""
    recorded = start.state.get("data_key")
    store = getattr(getattr(train, "packed", None), "store", None)
    if recorded is None or data_key is None or recorded == data_key:
        stamps = start.state.get("data_files")
        if store is not None and isinstance(stamps, dict):  # the same index; the same bytes in its shards too
            store.check_unchanged(stamps, since=f"{start.checkpoint} was written")
        return
    store = getattr(store, "path", "?")
    raise ConfigError(
        f"{start.checkpoint} was trained on token data {recorded}, but the training data is now {data_key} "
        f"({store}: the corpus changed since): its data_position {start.state['data_position']} would continue in "
        f"other data; restore the corpus it was trained on, or start a new output_dir")


__all__ = ["Start", "plan_start", "check_same_data", "ConfigError", "CheckpointError"]
