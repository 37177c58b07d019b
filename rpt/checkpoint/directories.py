"""Checkpoint directories: atomic writes, discovery of the newest complete one, pruning, and the
checks that make reading one back safe.

A checkpoint is written into a hidden temporary directory and renamed into place only when
complete, so ``checkpoint-<step>/`` either exists whole or not at all, whatever kills the run.

Reading a checkpoint never runs code: every ``torch.load`` here is ``weights_only=True`` (a pickle
that is not plain data is refused by name), the scheduler's state is JSON, and each checkpoint
carries ``manifest.json``, the SHA-256 of every file in it, written last and verified on resume
before any library opens a file -- DeepSpeed's engine reads its files with ``weights_only=False``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import re
import shutil
from typing import Any

from rpt.errors import CheckpointError
from rpt.result_files import write_atomic

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
    """A checkpoint's JSON record (indented, anything else as its ``str``), written atomically."""
    write_atomic(path, json.dumps(data, indent=2, default=str))


def read_json_file(path: str, what: str) -> Any:
    """``path`` parsed as JSON; a missing or malformed file is a :class:`CheckpointError` naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{path} does not exist: {what} needs it") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({e}); {what} cannot be read from it") from None


def read_trainer_state(checkpoint: str) -> dict[str, Any]:
    """``trainer_state.json`` of ``checkpoint``, its keys checked (step, data_position, config)."""
    path = os.path.join(checkpoint, TRAINER_STATE)
    state = read_json_file(path, "resuming")
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} must hold a JSON object; resume from another checkpoint or resume=none")
    for key in ("step", "data_position"):
        value = state.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise CheckpointError(f"{path} key {key!r} = {value!r} is not an integer >= 0; the checkpoint is damaged: "
                                  "resume from another checkpoint or resume=none")
    if not isinstance(state.get("config"), dict):
        raise CheckpointError(f"{path} key 'config' is missing or not a mapping; the checkpoint is damaged: "
                              "resume from another checkpoint or resume=none")
    return state


def load_plain(path: str, what: str) -> Any:
    """``torch.load(path, weights_only=True)``: tensors and plain containers only. A pickle that
    would build other objects (and could run code) or a damaged file is one error naming it."""
    import torch
    from accelerate.utils.other import TORCH_SAFE_GLOBALS  # numpy arrays and dtypes: accelerate's RNG states

    try:
        with torch.serialization.safe_globals(TORCH_SAFE_GLOBALS):
            return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path} does not exist: {what} needs it") from None
    except pickle.UnpicklingError as e:
        # weights_only stops at the first class, function or opcode it does not allow: building one is
        # what could run code, so the file is refused whatever it is (hostile, foreign or damaged)
        raise CheckpointError(f"{path} is not plain tensor data ({unpickling_detail(e)}); refusing to unpickle it: "
                              f"{what} reads only files rpt wrote (resume from another checkpoint)") from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise CheckpointError(f"{path} cannot be read ({_first_line(e)}); the file is damaged: {what} needs an intact copy") from None


def unpickling_detail(e: Exception) -> str:
    """What ``torch.load(weights_only=True)`` refused, in a few words (the global it names, or its reason)."""
    found = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)|WeightsUnpickler error: \s*([^\n]+)",
                      str(e))
    detail = (f"it names {found.group(1)}" if found.group(1) else found.group(2).strip()) if found else _first_line(e)
    return detail[:120]


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


# ---- manifest: a hash of every file, verified before anything reads the checkpoint -----------------
MANIFEST = "manifest.json"
_HASH_CHUNK = 1 << 20


def _file_hash(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_HASH_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def _files_under(directory: str) -> list[str]:
    found = []
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files):
            found.append(os.path.relpath(os.path.join(root, name), directory).replace(os.sep, "/"))
    return found


def _hashes(directory: str, names: list[str]) -> dict[str, str]:
    """SHA-256 of each file, several at a time (hashlib releases the GIL on large reads: a sharded
    checkpoint's files hash in parallel)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        return dict(zip(names, pool.map(lambda rel: _file_hash(os.path.join(directory, rel)), names)))


def write_manifest(directory: str) -> None:
    """Record the SHA-256 of every file under ``directory`` in its ``manifest.json`` (atomically)."""
    files = _hashes(directory, [rel for rel in _files_under(directory) if rel != MANIFEST])
    write_json_atomic(os.path.join(directory, MANIFEST), {"version": 1, "sha256": files})


def verify_manifest(directory: str) -> bool:
    """Check every file of ``directory`` against its manifest: a changed, missing or added file is a
    :class:`CheckpointError` naming it. Returns False for a checkpoint written before manifests."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        return False
    manifest = read_json_file(path, "verifying the checkpoint")
    recorded = manifest.get("sha256") if isinstance(manifest, dict) else None
    if not isinstance(recorded, dict) or not all(isinstance(v, str) for v in recorded.values()):
        raise CheckpointError(f"{path} is damaged (no 'sha256' mapping of file names to hashes); resume from another "
                              "checkpoint or resume=none")
    present = [rel for rel in _files_under(directory) if rel != MANIFEST]
    for rel in present:
        if rel not in recorded:
            raise CheckpointError(f"{os.path.join(directory, rel)} was added after the checkpoint was written (not in "
                                  f"its {MANIFEST}); refusing to resume from it: remove the file or resume from another checkpoint")
    for rel in recorded:
        if rel not in present:
            raise CheckpointError(f"{os.path.join(directory, rel)} is missing (listed in {MANIFEST}); the checkpoint is "
                                  "incomplete: resume from another checkpoint or resume=none")
    actual = _hashes(directory, sorted(recorded))
    for rel, digest in recorded.items():
        full = os.path.join(directory, rel)
        if actual[rel] != digest:
            raise CheckpointError(f"{full} changed after the checkpoint was written (its SHA-256 differs from "
                                  f"{MANIFEST}); refusing to resume from it: restore the file or resume from another checkpoint")
    return True


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
        raise CheckpointError(f"{checkpoint} holds the streamed-data positions of {saved} processes but this run has "
                         f"{world_size}; resume with {saved} processes (a stream is split by rank), or resume=none")
    state = load_plain(os.path.join(directory, f"rank-{rank}.pt"), "the streamed data's position")
    if not isinstance(state, dict):
        raise CheckpointError(f"{os.path.join(directory, f'rank-{rank}.pt')} holds a {type(state).__name__}, not the "
                              "data state mapping rpt writes; resume from another checkpoint or resume=none")
    return state


def check_plain_files(checkpoint: str) -> None:
    """Read every pickle-based file of an unverified (pre-manifest) checkpoint as plain data first,
    so a hostile or damaged one is refused by name before a library loads it."""
    for root, _dirs, files in os.walk(checkpoint):
        for name in sorted(files):
            if name.endswith((".bin", ".pkl", ".pt", ".pth")):
                load_plain(os.path.join(root, name), "resuming")


# ---- the learning-rate scheduler's state, as JSON -------------------------------------------------
SCHEDULER_STATE = "scheduler.json"
LEGACY_SCHEDULER_STATE = "custom_checkpoint_0.pkl"  # accelerate's register_for_checkpointing pickle


def save_scheduler_state(checkpoint: str, scheduler) -> None:
    """The scheduler's state as JSON (LambdaLR's is numbers and lists; its lambdas are not saved)."""
    state = {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"}
    write_json_atomic(os.path.join(checkpoint, SCHEDULER_STATE), state)


def load_scheduler_state(checkpoint: str, scheduler) -> None:
    """Restore the scheduler from :data:`SCHEDULER_STATE`, or from an older checkpoint's pickle read
    as plain data (``weights_only=True``: LambdaLR's pickled state is numbers and lists)."""
    path = os.path.join(checkpoint, SCHEDULER_STATE)
    if os.path.exists(path):
        state = read_json_file(path, "resuming the learning-rate schedule")
    else:
        path = os.path.join(checkpoint, LEGACY_SCHEDULER_STATE)
        state = load_plain(path, "resuming the learning-rate schedule")
    current = scheduler.state_dict()
    if not _scheduler_state_fits(state, len(current["base_lrs"])):
        raise CheckpointError(f"{path} does not hold this run's scheduler state (base_lrs: {len(current['base_lrs'])} "
                              "finite rates, last_epoch and _step_count integers); the checkpoint is damaged: resume "
                              "from another checkpoint or resume=none")
    scheduler.load_state_dict({**{k: v for k, v in state.items() if k in current}, "lr_lambdas": current["lr_lambdas"]})


def _scheduler_state_fits(state: Any, groups: int) -> bool:
    if not isinstance(state, dict):
        return False
    rates, epoch, count = state.get("base_lrs"), state.get("last_epoch"), state.get("_step_count")
    rates_ok = isinstance(rates, list) and len(rates) == groups and all(
        isinstance(r, (int, float)) and not isinstance(r, bool) and math.isfinite(r) for r in rates)
    return rates_ok and all(isinstance(v, int) and not isinstance(v, bool) for v in (epoch, count))
