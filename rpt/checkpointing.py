"""Checkpoint directories: atomic writes, discovery of the newest complete one, pruning.

A checkpoint is written into a hidden temporary directory and renamed into place only when
complete, so ``checkpoint-<step>/`` either exists whole or not at all, whatever kills the run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"


def checkpoint_dirs(output_dir: str) -> list[tuple[int, str]]:
    """``(step, path)`` of the complete checkpoints under ``output_dir``, oldest first."""
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        m = CHECKPOINT_RE.match(name)
        path = os.path.join(output_dir, name)
        if m and os.path.isfile(os.path.join(path, TRAINER_STATE)):
            found.append((int(m.group(1)), path))
    return sorted(found)


def latest_checkpoint(output_dir: str) -> str | None:
    found = checkpoint_dirs(output_dir)
    return found[-1][1] if found else None


def temp_dir_for(final_path: str) -> str:
    parent, name = os.path.split(final_path.rstrip("/"))
    return os.path.join(parent, f".{name}.tmp")


def clear_dir(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)


def commit_dir(tmp_path: str, final_path: str) -> None:
    """Move a finished temporary directory into place, replacing an older one."""
    if os.path.isdir(final_path):
        old = temp_dir_for(final_path) + ".old"
        clear_dir(old)
        os.rename(final_path, old)
        os.rename(tmp_path, final_path)
        shutil.rmtree(old)
    else:
        os.rename(tmp_path, final_path)


def write_json_atomic(path: str, data: Any) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_trainer_state(checkpoint: str) -> dict[str, Any]:
    with open(os.path.join(checkpoint, TRAINER_STATE)) as f:
        return json.load(f)


def prune_checkpoints(output_dir: str, keep_last: int) -> None:
    for _, path in checkpoint_dirs(output_dir)[:-keep_last]:
        shutil.rmtree(path, ignore_errors=True)


DATA_STATE_DIR = "data_state"


def save_data_state(checkpoint: str, rank: int, state: dict[str, Any]) -> None:
    """Each rank's data-pipeline position (streamed data only; a token store needs none)."""
    if not state:
        return
    import torch

    directory = os.path.join(checkpoint, DATA_STATE_DIR)
    os.makedirs(directory, exist_ok=True)
    torch.save(state, os.path.join(directory, f"rank-{rank}.pt"))


def load_data_state(checkpoint: str, rank: int, world_size: int) -> dict[str, Any]:
    directory = os.path.join(checkpoint, DATA_STATE_DIR)
    if not os.path.isdir(directory):
        return {}
    saved = len([n for n in os.listdir(directory) if n.startswith("rank-")])
    if saved != world_size:
        raise ValueError(f"{checkpoint} holds the streamed-data positions of {saved} processes but this run has "
                         f"{world_size}; resume with {saved} processes (a stream is split by rank), or resume=none")
    import torch

    return torch.load(os.path.join(directory, f"rank-{rank}.pt"), weights_only=True)
