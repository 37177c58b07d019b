"""Shared output helpers for the evaluation scripts.

Every script writes ``F.json`` plus ``F.md`` (markdown table) and ``F.png`` beside it, and keeps
finished items in ``F.items.jsonl`` so a rerun on the same ``--out`` skips them.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure  # no pyplot: no global backend state, safe off the main thread


def sibling(out: str | Path, suffix: str) -> Path:
    """``runs/x.json`` -> ``runs/x<suffix>``, e.g. ``.md``, ``.png``, ``.items.jsonl``."""
    out = Path(out)
    return out.with_name(out.stem + suffix) if out.suffix == ".json" else out.with_name(out.name + suffix)


def out_problem(out: str | Path, suffixes: Sequence[str] = (".md", ".png", ".items.jsonl")) -> str | None:
    """Why a report cannot be written at ``out`` and its siblings (``suffixes``), or None: checked
    before any work, so a bad ``--out`` never costs a run."""
    for path in (Path(out), *(sibling(out, s) for s in suffixes)):
        if path.is_dir():
            return f"--out {out}: {path} is a folder; name a file, e.g. --out {Path(out) / 'result.json'}"
    parent = Path(out).expanduser().absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"--out {out}: {parent} is a file, not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"--out {out}: cannot write in {parent}"
    return None


@contextmanager
def _atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp path in the target's directory; on success it replaces ``path`` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str) -> Path:
    """Write text atomically (temp file + ``os.replace``): readers never see half a file."""
    with _atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_json(path: str | Path, obj: Any) -> Path:
    """Write JSON atomically (temp file + ``os.replace``): readers never see half a file."""
    with _atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return Path(path)


def write_npz(path: str | Path, arrays: dict[str, Any]) -> Path:
    """Write numpy arrays as one compressed ``.npz`` atomically (``numpy.load`` reads it back)."""
    with _atomic_path(path) as tmp, open(tmp, "wb") as f:  # a file object: savez would append ".npz" to a name
        np.savez_compressed(f, **arrays)
    return Path(path)


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
    with _atomic_path(path) as tmp:
        tmp.write_text("\n".join(parts), encoding="utf-8")
    return Path(path)


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Save a matplotlib figure as PNG, atomically."""
    with _atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    return Path(path)


def bar_plot(path: str | Path, labels: Sequence[str], values: Sequence[float], title: str,
             ylabel: str, ylim: tuple[float, float] | None = (0.0, 1.0)) -> Path:
    """A labelled bar chart, e.g. pass@k or accuracy per setting."""
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
            with _atomic_path(self.path) as tmp:
                tmp.write_text(text, encoding="utf-8")
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
