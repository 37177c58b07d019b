"""What the sandbox runs and what comes back: a :class:`Job`, the :class:`Limits` it runs under
(and how its memory budget is split between the program and its in-memory files), the
:class:`Execution` the parent collected, and the reason a run did not deliver."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Limits:
    """Per-program limits. ``timeout``: wall-clock seconds for start-up and the program's own
    statements (and the whole run in ``program`` / ``replay`` mode); per-call limits come with the
    job. ``max_result_bytes`` caps what the program may send back."""

    timeout: float = 10.0
    memory_bytes: int = 2 << 30
    max_output_bytes: int = 64 << 10
    max_file_bytes: int = 16 << 20
    max_result_bytes: int = 256 << 20
    # One message (one line on the result pipe) at most: what the parent holds for a program at
    # any moment is bounded by this, not by what the program sends in all.
    max_message_bytes: int = 16 << 20
    # Under bubblewrap: the in-memory filesystems (scratch, /tmp, /dev/shm) together, taken out of
    # ``memory_bytes`` (at most a quarter of it), so files cannot add memory beyond the budget.
    scratch_bytes: int = 64 << 20
    isolation: str = "auto"
    # Only for testing the outer layers (process group kill, limits): never turn off for real use.
    reliability_guard: bool = True


@dataclass(frozen=True)
class Job:
    """What to run (see :mod:`rpt.sandbox._sandbox_runner` for the modes)."""

    program: str
    mode: str = "program"
    entry_point: str | None = None
    inputs: Sequence = ()  # calls mode: argument lists, already in wire form (``_wire.to_json``)
    time_limits: Sequence[float] | None = None  # calls mode: seconds per call, enforced here
    total_limit: float = 60.0  # calls mode: cap on the sum of the per-call limits (EvalPlus: 60 s)
    timing: bool = False  # calls mode: report each call's duration (ground truth runs only)
    max_message_bytes: int | None = None  # overrides ``Limits.max_message_bytes`` (sized to the expected outputs)


@dataclass
class Execution:
    """What came back. ``messages``: the child's JSON messages in order, as parsed by ``json``
    (values still in wire form); with a ``watch`` only the control messages (``load_error``,
    ``finished``), the rest being reduced by the watcher as they arrive; ``status``:
    ``"exited"``, ``"timed out"``, ``"stopped"`` (the caller's ``watch`` ended it), or
    ``"failed: <reason>"`` (result or message too large, a message off the protocol, sandbox
    failure)."""

    status: str
    messages: list[dict] = field(default_factory=list)
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0
    isolation: str = "none"


@dataclass(frozen=True)
class ExecResult:
    """Outcome of :func:`run_program`. ``passed``: the program ran to its end (self-reported by
    the child: fine for testing the sandbox, worthless as a benchmark verdict)."""

    passed: bool
    result: str
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float


def memory_split(limits: Limits) -> tuple[int, int]:
    """``(address-space limit, in-memory filesystem bytes)``: the files a program writes under
    bubblewrap live in memory (tmpfs), so their cap is taken out of its memory budget."""
    files = max(0, min(limits.scratch_bytes, limits.memory_bytes // 4)) // 4096 * 4096
    return limits.memory_bytes - files, files


def signal_reason(returncode: int | None) -> str | None:
    """Why a child died, from its return code; None if it was not killed by a signal."""
    if returncode is None or returncode >= 0:
        return None
    signum = -returncode
    if signum == signal.SIGXCPU:
        return "timed out"  # CPU-time limit: the program was busy, not waiting
    if signum == signal.SIGXFSZ:
        return "failed: output or file size limit exceeded"
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = str(signum)
    return f"failed: killed by {name}"


def exit_reason(execution: Execution) -> str:
    """A ``failed: ...`` / ``timed out`` reason for a run that did not deliver what was needed."""
    if execution.status != "exited":
        return execution.status
    for message in execution.messages:
        if "load_error" in message:
            return "failed: " + str(message["load_error"])[:500]
    reason = signal_reason(execution.returncode)
    if reason is None and execution.isolation == "bwrap" and execution.returncode not in (0, None):
        # bubblewrap passes the child's exit status through, and reports a killed child as 128 + signal
        reason = signal_reason(-(execution.returncode - 128)) if execution.returncode > 128 else None
    if reason is not None:
        return reason
    return f"failed: exited with status {execution.returncode} before the program finished"

