"""Directories a study writes, marked as its own: it never deletes or reuses what it did not write.

:func:`claim` creates a directory (or takes an empty one) and leaves a marker file in it naming the
writer; :func:`remove` deletes a directory only when it holds that marker (or is empty). A non-empty
directory without the marker is someone else's: both refuse it with :class:`ForeignDirectory`, one
line naming the directory and the fix, before anything in it is touched.

Where the guarantee stops: a marked directory is the writer's as a whole; a file a user puts inside
one goes with it when the study rewrites it (the marker says so).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

MARKER = ".written-by-rpt"


class ForeignDirectory(ValueError):
    """A directory the caller did not write; the message is the one line to show."""


def _foreign(path: Path, owner: str, action: str) -> ForeignDirectory:
    return ForeignDirectory(
        f"{path} is not empty and was not written by the {owner} (no {MARKER} file in it), so it will not {action} it: "
        f"move your files out or choose another directory (if it is an earlier run of the {owner}, `touch {path / MARKER}`)")


def owned(path: str | Path) -> bool:
    return (Path(path) / MARKER).is_file()


def problem(path: str | Path, owner: str, action: str = "write into") -> str | None:
    """Why ``path`` cannot be claimed or removed by ``owner``, or None (absent, empty, or marked)."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return None
    if not path.is_dir():
        return f"{path} is a file, not a directory; the {owner} needs a directory there"
    if owned(path) or not any(path.iterdir()):
        return None
    return str(_foreign(path, owner, action))


def check(paths: Iterable[str | Path], owner: str, action: str = "write into") -> None:
    """:func:`problem` for each path: raises :class:`ForeignDirectory` at the first (checked before any work)."""
    for path in paths:
        why = problem(path, owner, action)
        if why:
            raise ForeignDirectory(why)


def claim(path: str | Path, owner: str) -> Path:
    """``path`` created (with its parents) or taken when empty or already ``owner``'s, and marked."""
    path = Path(path)
    check([path], owner)
    path.mkdir(parents=True, exist_ok=True)
    marker = path / MARKER
    if not marker.exists():
        marker.write_text(f"written by the {owner}; it deletes and rewrites this directory as a whole\n")
    return path


def remove(path: str | Path, owner: str) -> None:
    """Delete ``path`` if it is ``owner``'s (marked) or empty; nothing when absent; otherwise refuse."""
    path = Path(path)
    check([path], owner, action="delete")
    if path.is_dir():
        shutil.rmtree(path)


def fresh(path: str | Path, owner: str) -> Path:
    """``path`` emptied (if it was ``owner``'s) and claimed anew."""
    remove(path, owner)
    return claim(path, owner)
