"""Reading user-supplied JSONL with one clear error per bad input (file and line number)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path


class EvalInputError(ValueError):
    """Bad evaluation input: a missing file, a malformed line, a wrong or missing field."""


def read_jsonl(
    path: str | Path,
    required: Iterable[str] = (),
    validate: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Read a JSONL file of objects; blank lines are skipped.

    ``required`` keys must be present on every line; ``validate(obj)`` may raise ``ValueError``
    for anything else. Every problem is re-raised as :class:`EvalInputError` naming the line.
    """
    path = Path(path)
    if not path.is_file():
        raise EvalInputError(f"{path}: file not found")
    required = tuple(required)
    records: list[dict] = []
    with open(path, "rb") as handle:  # bytes: a line that is not UTF-8 is reported with its number
        for lineno, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise EvalInputError(f"{path}:{lineno}: not UTF-8 text (byte {exc.start + 1} of the line); "
                                     "save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise EvalInputError(f"{path}:{lineno}: malformed JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise EvalInputError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            missing = [key for key in required if key not in obj]
            if missing:
                raise EvalInputError(f"{path}:{lineno}: missing field(s) {', '.join(missing)}")
            if validate is not None:
                try:
                    validate(obj)
                except ValueError as exc:
                    raise EvalInputError(f"{path}:{lineno}: {exc}") from None
            records.append(obj)
    return records


def read_completions(path: str | Path, id_field: str, check_id: Callable[[object], None]) -> list[dict]:
    """``{id_field, completion}`` records of a completions JSONL file, in file order.

    ``check_id(value)`` raises ``ValueError`` for an id the benchmark does not have; a non-string
    completion or an empty file is an :class:`EvalInputError` too.
    """

    def validate(obj: dict) -> None:
        if not isinstance(obj[id_field], (str, int)) or isinstance(obj[id_field], bool):
            # a list or dict id would fail later as "unhashable", without the file and line
            raise ValueError(f"{id_field} must be a string or an integer, got {type(obj[id_field]).__name__}")
        check_id(obj[id_field])
        if not isinstance(obj["completion"], str):
            raise ValueError(f"completion must be a string, got {type(obj['completion']).__name__}")

    records = read_jsonl(path, required=(id_field, "completion"), validate=validate)
    if not records:
        raise EvalInputError(f"{path}: no completions")
    return [{id_field: r[id_field], "completion": r["completion"]} for r in records]


def first_groups(records: list[dict], key: str, limit: int | None) -> list[dict]:
    """Keep the records of the first ``limit`` distinct ``key`` values, in input order."""
    if limit is None:
        return records
    seen: set = set()
    kept = []
    for record in records:
        if record[key] not in seen:
            if len(seen) == limit:
                continue
            seen.add(record[key])
        kept.append(record)
    return kept
