"""The files a run leaves: every result, record and checkpoint file written atomically (:func:`write_atomic`),
and the evaluation scripts' outputs.

Every evaluation script writes ``F.json`` plus ``F.md`` (markdown table) and ``F.png`` beside it, and keeps
finished items in ``F.items.jsonl`` so a rerun on the same ``--out`` skips them. numpy and matplotlib are
imported where a file needs them, so the checkpoint and data layers write through this module without them.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def sibling(out: str | Path, suffix: str) -> Path:
    """``runs/x.json`` -> ``runs/x<suffix>``, e.g. ``.md``, ``.png``, ``.items.jsonl``."""
    out = Path(out)
    return out.with_name(out.stem + suffix) if out.suffix == ".json" else out.with_name(out.name + suffix)


def write_atomic(path: str | Path, content: bytes | str | Callable[[BinaryIO], object]) -> Path:
    """Write ``content`` to ``path`` so that a reader sees the old file or the whole new one, never a part.

    ``content``: bytes, text (written as UTF-8), or a function writing into the binary file it is given. It goes
    to a temporary file in ``path``'s directory (created if missing), is flushed to disk (``fsync``) and then
    renamed over ``path`` (``os.replace``); if the write fails, the temporary file is removed and ``path`` is
    left as it was. The file gets the permissions an ``open`` would give it (the umask's)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as handle:
            if callable(content):
                content(handle)
            else:
                handle.write(content.encode("utf-8") if isinstance(content, str) else content)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_text(path: str | Path, text: str) -> Path:
    """Write text atomically (:func:`write_atomic`): readers never see half a file."""
    return write_atomic(path, text)


def write_json(path: str | Path, obj: Any) -> Path:
    """Write JSON atomically (:func:`write_atomic`): readers never see half a file."""
    return write_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def write_npz(path: str | Path, arrays: dict[str, Any]) -> Path:
    """Write numpy arrays as one compressed ``.npz`` atomically (``numpy.load`` reads it back)."""
    import numpy as np  # here, not at import: the checkpoint and data layers write through this module

    # into the file object: given a name, savez would append ".npz" to it
    return write_atomic(path, lambda handle: np.savez_compressed(handle, **arrays))


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table; floats are shown with 4 significant digits."""

    def cell(value: Any) -> str:
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_markdown(path: str | Path, title: str, tables: Sequence[tuple[Sequence[str], Sequence[Sequence[Any]]]],
                   notes: str = "") -> Path:
    """Write ``# title``, optional notes and one or more tables, atomically."""
    parts = [f"# {title}\n"]
    if notes:
        parts.append(notes.rstrip() + "\n")
    parts += [markdown_table(headers, rows) for headers, rows in tables]
    return write_atomic(path, "\n".join(parts))


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Save a matplotlib figure as PNG, atomically."""
    return write_atomic(path, lambda handle: fig.savefig(handle, format="png", dpi=120, bbox_inches="tight"))


def bar_plot(path: str | Path, labels: Sequence[str], values: Sequence[float], title: str,
             ylabel: str, ylim: tuple[float, float] | None = (0.0, 1.0)) -> Path:
    """A labelled bar chart, e.g. pass@k or accuracy per setting."""
    from matplotlib.figure import Figure  # here, not at import (as numpy); no pyplot: no global backend state

    fig = Figure(figsize=(max(3.0, 1.2 * len(labels) + 1.5), 3.2))
    ax = fig.add_subplot()
    bars = ax.bar(list(labels), list(values), color="tab:blue")
    ax.bar_label(bars, fmt="%.3f")
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    if ylim is not None:
        ax.set_ylim(*ylim)
    return save_figure(fig, path)


class ResultStore:
    """Finished items keyed by id, persisted as append-only JSONL beside the output.

    One line per item, flushed as it completes, so an interrupted run loses at most the line
    being written (a torn last line is ignored on reload). Ids must encode everything the result
    depends on (e.g. a hash of the completion), so a rerun with other inputs does not reuse
    stale results. Thread-safe ``add``.
    """

    def __init__(self, out: str | Path, fresh: bool = False) -> None:
        self.path = sibling(out, ".items.jsonl")
        self._items: dict[str, Any] = {}
        self._lock = threading.Lock()
        if fresh:
            self.path.unlink(missing_ok=True)
        elif self.path.exists():
            self._load()

    def _load(self) -> None:
        try:
            text = self.path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{self.path}: not UTF-8 text (byte {exc.start + 1}), so not a resume file this tool "
                             "wrote; rerun with --fresh") from None
        if not text.endswith("\n") and text:
            # A torn final line from an interrupted run: drop it, or the next append would glue onto it.
            text = text[: text.rfind("\n") + 1]
            write_atomic(self.path, text)
        for lineno, line in enumerate(text.splitlines(), start=1):
            try:
                entry = json.loads(line)
                self._items[str(entry["id"])] = entry["record"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ValueError(f"{self.path}:{lineno}: corrupt resume file; rerun with --fresh") from None

    def __contains__(self, item_id: str) -> bool:
        return item_id in self._items

    def __len__(self) -> int:
        return len(self._items)

    def get(self, item_id: str) -> Any:
        return self._items[item_id]

    def add(self, item_id: str, record: Any) -> None:
        line = json.dumps({"id": item_id, "record": record}, ensure_ascii=False)
        with self._lock:
            self._items[item_id] = record
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(line + "\n")
