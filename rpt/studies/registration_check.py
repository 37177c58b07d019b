"""Is a pre-registration in the history before any official result? Checked by file content.

A registered study names the files that fix its protocol (the pre-registration text and its
configs) and the file its official result is written to. The official run is allowed only when
each protocol file's bytes, as they are in the work tree now, are the file's content in some
commit that is an ancestor of HEAD (its *registration commit*: the first such commit), and every
registration commit precedes the first commit that added the official result (if one was
committed): a protocol changed after the result, or never committed, or edited in the work tree,
is refused. The content comparison is git's own blob id (``git hash-object``), so line endings
and every byte count.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path


class Refused(Exception):
    """An official run the guard will not allow; the message is the one line to show."""


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)


def _registration_commit(root: Path, path: str, fix: str) -> str:
    """The first commit in HEAD's history whose ``path`` has the work tree's bytes."""
    if not (root / path).is_file():
        raise Refused(f"{path} does not exist: {fix}")
    blob = _git(root, "hash-object", "--", path)
    if blob.returncode != 0:
        raise Refused(f"cannot read {path} with git ({blob.stderr.strip()}): {fix}")
    blob_id = blob.stdout.strip()
    history = _git(root, "log", "--format=%H", "--reverse", "--full-history", "HEAD", "--", path)
    for commit in history.stdout.split():
        if _git(root, "rev-parse", f"{commit}:{path}").stdout.strip() == blob_id:
            return commit
    raise Refused(f"{path} as it is now is in no commit of this branch's history (uncommitted or edited): {fix}")


def check(root: str | Path, protocol: Sequence[str], result: str, fix: str) -> dict:
    """``{path: {"blob": id, "commit": registration commit}}`` for each protocol file, or
    :class:`Refused` (one line, ending in ``fix``) when the official run is not allowed."""
    root = Path(root)
    if shutil.which("git") is None:
        raise Refused(f"the official run needs its pre-registration committed in git, and git is not installed: {fix}")
    if _git(root, "rev-parse", "--is-inside-work-tree").returncode != 0:
        raise Refused(f"the official run needs its pre-registration committed in git, and {root} is not a git work "
                      f"tree: {fix}")
    if _git(root, "rev-parse", "--verify", "-q", "HEAD").returncode != 0:
        raise Refused(f"{root} has no commit yet: {fix}")
    registered = {}
    for path in protocol:
        commit = _registration_commit(root, path, fix)
        registered[path] = {"blob": _git(root, "rev-parse", f"{commit}:{path}").stdout.strip(), "commit": commit}
    added = _git(root, "log", "--format=%H", "--diff-filter=A", "--reverse", "--full-history", "HEAD", "--", result)
    first_result = next(iter(added.stdout.split()), None)
    if first_result is not None:
        for path, reg in registered.items():
            before = reg["commit"] != first_result and _git(
                root, "merge-base", "--is-ancestor", reg["commit"], first_result).returncode == 0
            if not before:
                raise Refused(f"{path} as it is now was committed in {reg['commit'][:10]}, not before the official "
                              f"result {result} (first committed in {first_result[:10]}): a protocol changed after "
                              f"its result is not a pre-registration; {fix}")
    return registered


def code_commit(root: str | Path) -> dict:
    """The commit the code ran at and whether the work tree had uncommitted changes to tracked files."""
    root = Path(root)
    head = _git(root, "rev-parse", "HEAD")
    dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    return {"commit": head.stdout.strip() if head.returncode == 0 else None,
            "uncommitted_changes": bool(dirty.stdout.strip()) if dirty.returncode == 0 else None}
