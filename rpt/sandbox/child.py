"""One started runner: its process (its own session, killed as a group), the job line on its
stdin, the result pipe read with deadlines and size caps, and the captured output."""

from __future__ import annotations

import json
import math
import os
import select
import signal
import subprocess
import threading
import time
from pathlib import Path

from rpt.sandbox.job import Execution, Job, Limits, memory_split
from rpt.sandbox.launch import launch_command, unprivileged
from rpt.sandbox.protocol import run_budget


class Child:
    """One started runner: its process, the result pipe (read with deadlines) and its job line on
    stdin (kept open in ``serve`` mode for the requests that follow)."""

    def __init__(self, base: Path, job: Job, limits: Limits, kind: str) -> None:
        self.base, self.limits, self.kind = base, limits, kind
        self.max_line = job.max_message_bytes or limits.max_message_bytes
        scratch = base / "work"
        scratch.mkdir()
        self.read_fd, write_fd = os.pipe()
        self.pending = bytearray()
        self.received = 0
        self.exited_at: float | None = None
        address_space = memory_split(limits)[0] if kind == "bwrap" else limits.memory_bytes
        payload = json.dumps({
            "mode": job.mode, "program": job.program, "entry_point": job.entry_point, "inputs": list(job.inputs),
            "time_limits": list(job.time_limits) if job.time_limits is not None else None,
            "timing": job.timing, "result_fd": write_fd, "memory_bytes": address_space,
            "cpu_seconds": math.ceil(limits.timeout + run_budget(job)) + 1,
            "file_bytes": max(limits.max_file_bytes, limits.max_output_bytes), "guard": limits.reliability_guard,
        }).encode("utf-8") + b"\n"
        self.start = time.monotonic()
        fds: list[int] = []
        try:
            argv, env = launch_command(kind, base, limits, fds)
            with open(base / "stdout", "wb") as out, open(base / "stderr", "wb") as err:
                self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=err,
                                             cwd="/" if kind == "bwrap" else scratch, env=env,
                                             pass_fds=(write_fd, *fds),
                                             start_new_session=True,  # own group: killpg reaches all
                                             **(unprivileged() if kind == "bwrap" else {}))
        except OSError:
            os.close(self.read_fd)
            raise
        finally:
            for fd in (write_fd, *fds):
                os.close(fd)
        self.stdin_lock = threading.Lock()
        # Written from a thread: a job of many MB must not block the reader past a deadline.
        threading.Thread(target=self._send_raw, args=(payload, job.mode != "serve"), daemon=True).start()

    def _send_raw(self, data: bytes, close: bool = False) -> bool:
        with self.stdin_lock:
            try:
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
                if close:
                    self.proc.stdin.close()
                return True
            except (BrokenPipeError, OSError, ValueError):
                return False  # the child is gone: its status says why

    def send(self, obj: dict) -> bool:
        return self._send_raw(json.dumps(obj, separators=(",", ":")).encode("utf-8") + b"\n")

    def _line(self) -> bytes | None:
        end = self.pending.find(b"\n")
        if end < 0:
            return None
        line = bytes(self.pending[:end])
        del self.pending[: end + 1]
        return line

    def read(self, deadline: float) -> dict | str:
        """The next message, or why there is none: ``"timed out"``, ``"exited"``, ``"failed: ..."``."""
        while True:
            line = self._line()
            if line is not None:
                if len(line) > self.max_line:
                    return "failed: a message from the program is too large"
                try:
                    message = json.loads(line)
                except (ValueError, RecursionError):
                    return "failed: malformed message from the program"
                return message if isinstance(message, dict) else "failed: malformed message from the program"
            if len(self.pending) > self.max_line:  # no end of line in sight: stop holding it
                return "failed: a message from the program is too large"
            now = time.monotonic()
            if now >= deadline:
                return "timed out"
            ready, _, _ = select.select([self.read_fd], [], [], min(deadline - now, 0.05))
            if ready:
                chunk = os.read(self.read_fd, 1 << 20)
                if not chunk:
                    return "exited"  # every writer closed: the child and anything it started are gone
                self.received += len(chunk)
                if self.received > self.limits.max_result_bytes:
                    return "failed: result too large"
                self.pending += chunk
            elif self.proc.poll() is not None:
                # Exited, but something it left behind may hold the pipe open: a moment, then end.
                self.exited_at = self.exited_at or time.monotonic()
                if time.monotonic() - self.exited_at > 0.2:
                    return "exited"

    def close(self, execution: Execution) -> Execution:
        """Kill what is left, collect the exit status and the captured output."""
        if execution.status == "exited":
            try:  # let it finish on its own, so its exit status is its own
                self.proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
        _kill_group(self.proc.pid)
        self.proc.wait()
        with self.stdin_lock:
            try:
                self.proc.stdin.close()
            except (OSError, ValueError):
                pass
        os.close(self.read_fd)
        self.pending = bytearray()
        execution.returncode = self.proc.returncode
        execution.stdout = _read_capped(self.base / "stdout", self.limits.max_output_bytes)
        execution.stderr = _read_capped(self.base / "stderr", self.limits.max_output_bytes)
        execution.seconds = time.monotonic() - self.start
        return execution


def _kill_group(pgid: int) -> None:
    # Repeated because a member that was mid-fork during one round may surface in the next.
    for _ in range(3):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return  # the group is gone


def _read_capped(path: Path, limit: int) -> str:
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError:
        return ""
    text = data[:limit].decode("utf-8", errors="replace")
    return text + "\n...[truncated]" if len(data) > limit else text

