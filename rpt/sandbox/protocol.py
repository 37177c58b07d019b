"""What the parent accepts from a running program, and by when: the message shapes of each mode
(:data:`PROTOCOL`, checked by :class:`Protocol`), the part of a message kept past its arrival
(:func:`control_fields`), and the deadlines (:class:`Deadline`) measured here by arrival time, so a
program cannot lie about how long it took."""

from __future__ import annotations

from rpt.sandbox.job import Job, Limits


def run_budget(job: Job) -> float:
    """Seconds the calls of ``job`` may take in all, after start-up."""
    if job.mode != "calls":
        return 0.0
    return job.total_limit if job.time_limits is None else min(job.total_limit, float(sum(job.time_limits)))


class Deadline:
    """When the next message must have arrived, from the job's limits and what came so far.

    The clock starts once: the first ``ready`` fixes the start of the calls (a program that sends
    it again gains nothing), and nothing that arrives moves :meth:`at` past the absolute end,
    start + ``timeout`` + the calls' budget (+ 1 s of slack)."""

    def __init__(self, job: Job, limits: Limits, start: float) -> None:
        self.job, self.start = job, start
        self.load = start + limits.timeout
        self.end = self.load + run_budget(job) + 1.0
        self.ready: float | None = None
        self.results = 0
        if job.mode == "calls" and job.time_limits is not None:
            self.cumulative = [0.0]
            for t in job.time_limits:
                self.cumulative.append(self.cumulative[-1] + float(t))
        else:
            self.cumulative = None

    def seen(self, message: dict, now: float) -> None:
        if "ready" in message:
            self.ready = now if self.ready is None else self.ready
        elif "i" in message:
            self.results += 1

    def at(self) -> float:
        if self.ready is None or self.job.mode != "calls":
            return self.load
        n = len(self.job.inputs)
        if self.cumulative is None:
            allowed = self.job.total_limit + 1.0
        else:
            # +0.5 s: scheduling slack on a loaded machine; the alarm in the child fires at the limit.
            allowed = min(self.cumulative[min(self.results + 1, n)], self.job.total_limit, self.cumulative[n]) + 0.5
        return min(self.ready + allowed, self.end)


CONTROL = ("load_error", "finished")  # the messages a verdict on the run itself needs
# What the runner sends, by mode (a result may carry its time, "t"): anything else, or a second
# "ready", is the program speaking on the pipe, and fails it.
PROTOCOL = {
    "program": ({"finished"}, {"load_error"}),
    "calls": ({"ready"}, {"i", "v"}, {"i", "e"}, {"i", "x"}, {"end"}, {"load_error"}),
}


class Protocol:
    """Checks each message of a ``program`` / ``calls`` run against :data:`PROTOCOL`: the known
    shapes only, ``ready`` once and first, at most one result per input, nothing after the last
    word (``end``, ``finished``, ``load_error``). So even a run without a watcher keeps a bounded
    number of messages."""

    def __init__(self, job: Job) -> None:
        self.shapes = PROTOCOL.get(job.mode, ())
        self.results_left = len(job.inputs)
        self.ready = self.over = False

    def allows(self, message: dict) -> bool:
        keys = set(message) - {"t"} if "i" in message else set(message)
        if self.over or keys not in self.shapes or ("ready" in keys and self.ready):
            return False
        if "i" in keys:
            self.results_left -= 1
            if self.results_left < 0 or not self.ready:
                return False
        self.ready = self.ready or "ready" in keys
        self.over = bool(keys & {"end", "finished", "load_error"})
        return True


def control_fields(message: dict) -> dict:
    """The part of a message kept past its arrival (bounded: a load error is cut to 500 characters)."""
    return {key: str(message[key])[:500] if key == "load_error" else message[key]
            for key in CONTROL if key in message}


