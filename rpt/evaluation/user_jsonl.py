"""Reading user-supplied JSONL with one clear error per bad input (file and line number)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from rpt.append_log import NotAJSONObject, json_object_lines
from rpt.errors import EvalInputError


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
    try:
        for lineno, obj in json_object_lines(str(path)):
            missing = [key for key in required if key not in obj]
            if missing:
                raise EvalInputError(f"{path}:{lineno}: missing field(s) {', '.join(missing)}")
            if validate is not None:
                try:
                    validate(obj)
                except ValueError as exc:
                    raise EvalInputError(f"{path}:{lineno}: {exc}") from None
            records.append(obj)
    except NotAJSONObject as exc:
        problem = exc.problem("malformed JSON ({})", "expected a JSON object, got {}")
        raise EvalInputError(f"{path}:{exc.line}: {problem}") from None
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


def select_tasks(records: list[dict], key: str, tasks: Sequence, limit: int | None) -> tuple[list[dict], dict]:
    """The records of the benchmark's first ``limit`` tasks (``tasks`` in benchmark order; all of them
    when ``limit`` is None), in input order, and what the file held beside them:
    ``{"ignored_completions": records for tasks past the limit, "tasks_without_completion": tasks
    of the selection the file has no record for, "first_without_completion": up to 5 of those}``.

    ``--limit N`` means the benchmark's first N tasks whatever the file holds, never the file's
    first N task ids."""
    selected = list(tasks) if limit is None else list(tasks)[:limit]
    wanted = set(selected)
    kept = [r for r in records if r[key] in wanted]
    present = {r[key] for r in kept}
    missing = [t for t in selected if t not in present]
    return kept, {"ignored_completions": len(records) - len(kept), "tasks_without_completion": len(missing),
                  "first_without_completion": missing[:5]}
