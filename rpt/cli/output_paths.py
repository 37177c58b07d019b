"""The one check of an output path, made before any work: a path that cannot be written fails at once,
not after a run, and nothing is left half-written.

What is refused depends on what the command writes there: a file (``sample.py --output``, an evaluation's
``--out`` and the files it writes beside it), or a directory (``output_dir``, ``prepare_data.py --out``,
``merge_lora.py``'s output, ``eval/table1.py --out``); whether missing parent directories are created
(everywhere but ``sample.py --output``, which writes into an existing directory).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from rpt.errors import InputError
from rpt.result_files import sibling

REPORT_SIBLINGS = (".md", ".png", ".items.jsonl")  # what an evaluation writes beside its F.json (rpt.result_files)


def _nearest_existing(path: str) -> str:
    """``path`` or its closest ancestor that exists."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def output_problem(path: str, flag: str, *, directory: bool = False, siblings: Sequence[str] = (),
                   create_parents: bool = True, example: str = "result.json") -> str | None:
    """Why ``path`` (given as ``flag``: ``--out``, ``config key 'output_dir'``, ...) cannot be written, or None.

    ``directory``: the command writes a directory there (else a file, and one beside it per suffix of
    ``siblings``, :func:`rpt.result_files.sibling`); ``create_parents``: the command creates missing parent
    directories (else the parent must exist); ``example``: a file name the fix for a directory suggests."""
    path = str(path)
    if directory:
        if os.path.exists(path) and not os.path.isdir(path):
            return f"{flag} {path!r} is a file, not a directory; choose another path or move the file"
    else:
        if os.path.isdir(path):
            return f"{flag} {path!r} is a directory; give a file name (e.g. {os.path.join(path, example)})"
        for taken in (str(sibling(path, s)) for s in siblings):
            if os.path.isdir(taken):
                return f"{flag} {path!r}: {taken!r}, written beside it, is a directory; move it or choose another {flag}"
    parent = os.path.dirname(os.path.abspath(path))
    if not create_parents and not os.path.isdir(parent):
        shown = os.path.dirname(path)
        return f"{flag} {path!r}: the directory {shown or '.'!r} does not exist; create it first (mkdir -p {shown})"
    existing = _nearest_existing(path if directory else parent)
    if not os.path.isdir(existing):
        return f"{flag} {path!r} cannot be created: {existing!r} is a file; choose another path"
    if not os.access(existing, os.W_OK | os.X_OK):
        return (f"{flag} {path!r} is not writable ({existing!r} does not allow writing); choose a directory you can "
                "write to")
    return None


def check_output(path: str, flag: str, error: type[Exception] = InputError, **how) -> None:
    """:func:`output_problem` raised as ``error`` (the caller's kind of input error)."""
    problem = output_problem(path, flag, **how)
    if problem is not None:
        raise error(problem)
