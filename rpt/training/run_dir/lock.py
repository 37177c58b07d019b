"""One trainer per ``output_dir``: ``<output_dir>/run.lock``, taken by the main process at start-up.

Two trainers on one output directory would interleave ``metrics.jsonl`` and race on each other's
temporary checkpoint directories. The lock names its holder (host, pid, the process's start time)
and carries a heartbeat, rewritten every :data:`HEARTBEAT_S` seconds by a background thread, so a
lock left by a dead job is recognised as stale: on this host, its process is gone (or its pid now
belongs to another process); on any host, its heartbeat is older than :data:`STALE_S`. A stale
lock is taken over with a printed note; a live one stops the second trainer with one line naming
the holder. ``--break-lock`` (``RPT_BREAK_RUN_LOCK=1``) takes a lock whatever its state.

The lock is created with ``link(2)`` of a complete temporary file (atomic, and atomic on NFS as
well), so whichever of two simultaneous trainers links first holds it, and no reader ever sees a
half-written lock. Released when the run returns or fails (``train.py``), and at process exit.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import threading
import time
import uuid
from typing import Any

from rpt.result_files import write_atomic
from rpt.training.config import ConfigError

LOCK_NAME = "run.lock"
HEARTBEAT_S = 30.0
STALE_S = 300.0  # ten missed heartbeats: the holder is dead (or frozen for five minutes)
BREAK_ENV = "RPT_BREAK_RUN_LOCK"

_HELD: dict[str, _Held] = {}  # absolute lock path -> what this process holds
_GUARD = threading.Lock()


class _Held:
    def __init__(self, path: str, record: dict[str, Any]):
        self.path, self.record = path, record
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="rpt-run-lock-heartbeat", daemon=True)
        self.thread.start()

    def _beat(self) -> None:
        while not self.stop.wait(HEARTBEAT_S):
            holder = _read(self.path)
            if not holder or holder.get("token") != self.record["token"]:
                print(f"warning: {self.path} was taken over by {_describe(holder)}; another trainer may now write "
                      "this output_dir", flush=True)
                return
            self.record["heartbeat"] = time.time()
            _write_replace(self.path, self.record)


def _proc_start(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (Linux), so a reused pid is not mistaken
    for the holder; None where /proc does not say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _alive(pid: int, start: Any) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        pass
    now = _proc_start(pid)
    return start is None or now is None or now == start


def _read(path: str) -> dict[str, Any] | None:
    """The lock's record; None for a lock that does not parse (or is gone)."""
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _write_replace(path: str, record: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(record))


def _describe(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "a trainer that is still writing its lock"
    beat = holder.get("heartbeat")
    age = f", heartbeat {time.time() - beat:.0f} s ago" if isinstance(beat, (int, float)) else ""
    return f"host {holder.get('host')!r} pid {holder.get('pid')}{age}"


def stale_reason(holder: dict[str, Any] | None, lock_mtime: float, now: float | None = None) -> str | None:
    """Why the lock ``holder`` (its parsed record; None: unreadable) is stale, or None when its holder
    may be alive."""
    now = time.time() if now is None else now
    if holder is None:  # torn or foreign content: stale once nobody has touched it for STALE_S
        return f"unreadable and untouched for {now - lock_mtime:.0f} s" if now - lock_mtime > STALE_S else None
    beat = holder.get("heartbeat")
    if not isinstance(beat, (int, float)) or now - beat > STALE_S:
        return f"no heartbeat for {now - beat:.0f} s" if isinstance(beat, (int, float)) else "no heartbeat recorded"
    pid = holder.get("pid")
    if holder.get("host") == socket.gethostname() and isinstance(pid, int):
        if pid == os.getpid():
            mine = any(h.record["token"] == holder.get("token") for h in _HELD.values())
            return None if mine else "left by an earlier run of this process"
        if not _alive(pid, holder.get("pid_start")):
            return f"its process {pid} on this host is gone"
    return None


def _create(path: str, tmp: str, record: dict[str, Any]) -> None:
    """Create ``path`` holding ``record``, atomically; FileExistsError when it exists."""
    try:
        os.link(tmp, path)  # a complete file appears at once, or not at all: one of two racers wins
    except FileExistsError:
        raise
    except OSError:  # a file system without hard links: exclusive creation, then the record
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(record, f)


def take_run_lock(output_dir: str, force: bool | None = None) -> None:
    """Hold ``<output_dir>/run.lock`` for this process, or a :class:`~rpt.training.config.ConfigError` naming
    the trainer that holds it. ``force`` (default: ``RPT_BREAK_RUN_LOCK=1``) takes it regardless."""
    path = os.path.abspath(os.path.join(output_dir, LOCK_NAME))
    force = os.environ.get(BREAK_ENV, "") not in ("", "0") if force is None else force
    with _GUARD:
        held = _HELD.pop(path, None)
        if held is not None:
            if (_read(path) or {}).get("token") == held.record["token"]:
                _HELD[path] = held
                return  # this process holds it already (a second run in one process)
            held.stop.set()
        if os.path.isdir(path) and not os.path.islink(path):
            raise ConfigError(f"{path} is a directory; it is where a trainer's lock goes: remove it")
        if os.path.islink(path):  # link(2) cannot replace it and stat follows it: named here, not retried
            target = os.readlink(path)
            state = "" if os.path.exists(path) else ", which does not exist"
            raise ConfigError(f"{path} is a symbolic link (to {target}{state}), not a trainer's lock file; remove the "
                              f"link (rm {path}) and start the run again")
        now = time.time()
        record = {"host": socket.gethostname(), "pid": os.getpid(), "pid_start": _proc_start(os.getpid()),
                  "token": uuid.uuid4().hex, "started": now, "heartbeat": now}
        tmp = f"{path}.{record['token']}.tmp"  # not write_atomic: link(2) of a complete file creates the lock,
        with open(tmp, "w", encoding="utf-8") as f:  # failing where one exists, which os.replace would overwrite
            json.dump(record, f)
        try:
            for _ in range(5):
                try:
                    _create(path, tmp, record)
                    break
                except FileExistsError:
                    _clear_stale(path, force)
            else:
                raise ConfigError(f"{path} keeps being taken by other trainers; stop them, then start this run again")
        finally:
            os.unlink(tmp)
        _HELD[path] = _Held(path, record)


def _clear_stale(path: str, force: bool) -> None:
    """Move a stale (or, with ``force``, any) lock out of the way, or refuse with the holder named."""
    holder = _read(path)
    try:
        mtime = os.stat(path).st_mtime
    except FileNotFoundError:
        return  # released meanwhile: try again
    reason = "--break-lock" if force else stale_reason(holder, mtime)
    if reason is None:
        raise ConfigError(f"another trainer is using output_dir {os.path.dirname(path)}: {path} is held by "
                          f"{_describe(holder)}; wait for it to finish, or use another output_dir (if that trainer is "
                          f"dead, the lock goes stale after {STALE_S:.0f} s without a heartbeat; train.py --break-lock "
                          "takes it now)")
    aside = f"{path}.stale-{uuid.uuid4().hex}"
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return  # another starter moved it first
    moved = _read(aside)
    if holder is not None and (moved or {}).get("token") != holder.get("token"):
        # Between reading and moving, another starter replaced the stale lock with its own: put it back.
        try:
            os.link(aside, path)
        except FileExistsError:
            pass
        os.unlink(aside)
        raise ConfigError(f"another trainer just took {path} ({_describe(moved)}); use another output_dir")
    os.unlink(aside)
    print(f"note: took over {path} from {_describe(holder)} ({reason})", flush=True)


class LockLost(ConfigError):
    """This trainer's lock was taken by another (``--break-lock``): it stops before its next write."""


def lost_reason(output_dir: str) -> str | None:
    """Why this process no longer holds ``output_dir``'s lock, or None (it does, or it never took one).
    One read of a small file: cheap enough before every write of metrics or a checkpoint."""
    path = os.path.abspath(os.path.join(output_dir, LOCK_NAME))
    held = _HELD.get(path)
    if held is None:
        return None
    holder = _read(path)  # the lock is replaced atomically: a reader sees a whole record or none
    if holder is not None and holder.get("token") == held.record["token"]:
        return None
    return (f"{path} was taken over by {_describe(holder)}" if holder is not None or os.path.lexists(path)
            else f"{path} was removed")


def release_run_lock(output_dir: str | None = None) -> None:
    """Release the lock of ``output_dir`` (None: every lock) held by this process; others untouched."""
    with _GUARD:
        paths = list(_HELD) if output_dir is None else [os.path.abspath(os.path.join(output_dir, LOCK_NAME))]
        for path in paths:
            held = _HELD.pop(path, None)
            if held is None:
                continue
            held.stop.set()
            held.thread.join(timeout=10)  # not mid-rewrite: a beat after the unlink would leave the lock behind
            holder = _read(path)
            if holder and holder.get("token") == held.record["token"]:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass


atexit.register(release_run_lock)
