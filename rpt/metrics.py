"""``metrics.jsonl``: one JSON object per log step, appended; trimmed on resume."""

from __future__ import annotations

import json
import os
from typing import Any


def read_metrics(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    break  # a line cut short by a kill: everything after it is lost anyway
    return rows


class MetricsLog:
    """Append-only JSONL log. ``truncate_after(step)`` drops rows a killed run logged past the
    checkpoint it resumes from, so the file reads as one uninterrupted run."""

    def __init__(self, path: str):
        self.path = path

    def truncate_after(self, step: int) -> None:
        rows = [r for r in read_metrics(self.path) if r.get("step", 0) <= step]
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        os.replace(tmp, self.path)

    def write(self, row: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
