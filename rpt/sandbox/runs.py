"""Running jobs to their end: one (:func:`execute`, with an optional watcher that reduces each
message as it arrives), many over a thread pool (:func:`run_jobs`), and the self-reported
``program`` mode (:func:`run_program`, for testing the sandbox, never for scoring)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rpt.sandbox.child import Child
from rpt.sandbox.isolation_modes import isolation
from rpt.sandbox.job import ExecResult, Execution, Job, Limits, exit_reason
from rpt.sandbox.protocol import CONTROL, Deadline, Protocol, control_fields


def execute(job: Job, limits: Limits | None = None, watch: Callable[[dict], bool] | None = None) -> Execution:
    """Run ``job`` in a fresh sandboxed interpreter and collect its messages.

    ``watch(message)`` sees each message as it arrives and returns False to stop the run early
    (e.g. at the first wrong output). In ``calls`` mode result ``i`` must arrive within the sum
    of the first ``i + 1`` per-call limits after the program has loaded, else the run times out.
    """
    limits = limits or Limits()
    kind, _ = isolation(limits.isolation)
    base = Path(tempfile.mkdtemp(prefix="rpt-sandbox-"))
    try:
        return _execute_in(base, job, limits, watch, kind)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _execute_in(base: Path, job: Job, limits: Limits, watch, kind: str) -> Execution:
    try:
        child = Child(base, job, limits, kind)
    except OSError as exc:
        return Execution(status=f"failed: could not start the sandbox: {exc}", isolation=kind)
    execution = Execution(status="exited", isolation=kind)
    protocol = Protocol(job)
    try:
        deadline = Deadline(job, limits, child.start)
        while True:
            message = child.read(deadline.at())
            if isinstance(message, str):
                execution.status = message
                break
            if not protocol.allows(message):
                execution.status = "failed: unexpected message from the program"
                break
            deadline.seen(message, time.monotonic())
            if watch is None:
                execution.messages.append(message)  # the caller wants them all (a trusted run)
                continue
            if any(key in message for key in CONTROL):
                execution.messages.append(control_fields(message))
            try:
                go_on = watch(message)
            except Exception as exc:  # the watcher's bug or the program's doing: this run fails, not all
                execution.status = f"failed: checking a message raised {type(exc).__name__}"
                break
            if not go_on:
                execution.status = "stopped"
                break
    finally:
        child.close(execution)
    return execution


def run_jobs(
    jobs: Sequence[Job],
    limits: Limits | None = None,
    workers: int | None = None,
    on_done: Callable[[int, Execution], None] | None = None,
    watch: Callable[[int], Callable[[dict], bool] | None] | None = None,
) -> list[Execution]:
    """Run many jobs over a bounded thread pool; results come back in input order.

    Threads suffice because each worker only waits on its child process. ``on_done(i, execution)``
    is called from worker threads as results arrive; ``watch(i)`` gives job ``i``'s watcher.
    """
    limits = limits or Limits()
    isolation(limits.isolation)  # probe (and warn) once, before the workers start
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs) or 1))

    def task(i: int) -> Execution:
        execution = execute(jobs[i], limits, watch(i) if watch is not None else None)
        if on_done is not None:
            on_done(i, execution)
        return execution

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(task, range(len(jobs))))


def _program_result(execution: Execution) -> ExecResult:
    finished = execution.status == "exited" and any(m.get("finished") == 1 for m in execution.messages)
    result = "passed" if finished else exit_reason(execution)
    if not finished and result.startswith("failed: exited with status 0"):
        result = "failed: exited with status 0 before the program finished"
    return ExecResult(finished, result, execution.returncode, execution.stdout, execution.stderr, execution.seconds)


def run_program(program: str, limits: Limits | None = None) -> ExecResult:
    """Execute ``program`` and report whether it ran to its end (self-reported; see ExecResult)."""
    return _program_result(execute(Job(program), limits))


def run_programs(
    programs: Sequence[str],
    limits: Limits | None = None,
    workers: int | None = None,
    on_done: Callable[[int, ExecResult], None] | None = None,
) -> list[ExecResult]:
    """:func:`run_program` over many programs (input order kept)."""
    done = None if on_done is None else (lambda i, e: on_done(i, _program_result(e)))
    return [_program_result(e) for e in run_jobs([Job(p) for p in programs], limits, workers, done)]
