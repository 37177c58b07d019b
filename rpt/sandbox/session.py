"""An interactive run (``serve`` mode): the program loaded once in the sandbox, each call's
arguments sent to it and its reply read back, while the caller's own code (a benchmark's test)
stays in this process."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from rpt.sandbox import _wire
from rpt.sandbox.child import Child
from rpt.sandbox.isolation_modes import isolation
from rpt.sandbox.job import Execution, Job, Limits
from rpt.sandbox.protocol import CONTROL, control_fields


class SessionOver(BaseException):
    """The interactive run ended (the reason is the message). A BaseException, so that a test's
    own ``except Exception`` cannot swallow it."""


class Session:
    """An interactive run (``serve`` mode): the program is loaded once, then :meth:`call` sends
    one call's arguments and waits for its result. The caller's own code (a benchmark's test)
    drives the calls and never leaves this process, so the child holds nothing but the program and
    the arguments it is given. Everything must finish within ``limits.timeout`` of the start.

    Use as a context manager; :attr:`execution` has the outcome once it is closed and
    :attr:`failure` why it ended early (None while it runs)."""

    def __init__(self, program: str, entry_point: str, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.kind, _ = isolation(self.limits.isolation)
        self.job = Job(program, mode="serve", entry_point=entry_point)
        self.execution = Execution(status="exited", isolation=self.kind)
        self.failure: str | None = None
        self.child: Child | None = None

    def __enter__(self) -> Session:
        self.base = Path(tempfile.mkdtemp(prefix="rpt-sandbox-"))
        try:
            self.child = Child(self.base, self.job, self.limits, self.kind)
        except OSError as exc:
            self.failure = f"failed: could not start the sandbox: {exc}"
            return self
        self.deadline = self.child.start + self.limits.timeout  # absolute: no message moves it
        message = self._next()
        if message is not None and message != {"ready": 1}:
            self.failure = "failed: " + str(message.get("load_error", "unexpected message from the program"))[:500]
        return self

    def _next(self) -> dict | None:
        message = self.child.read(self.deadline)
        if isinstance(message, str):
            self.execution.status = message
            self.failure = self.failure or message
            return None
        if any(key in message for key in CONTROL):
            self.execution.messages.append(control_fields(message))
        return message

    def call(self, args: Sequence, kwargs: dict) -> dict:
        """``{"v": value}`` (wire form) or ``{"e": error}``; raises :class:`SessionOver` once the
        program is gone, out of time or off the protocol."""
        if self.failure is None and self.child is not None:
            if not self.child.send({"a": _wire.to_json(list(args)), "k": _wire.to_json(dict(kwargs))}):
                self.failure = "exited"
            else:
                message = self._next()
                if message is not None and set(message) in ({"v"}, {"e"}):
                    return message
                if message is not None:
                    self.failure = "failed: unexpected message from the program"
        raise SessionOver(self.failure or "the sandbox is not running")

    def __exit__(self, *exc) -> None:
        if self.child is not None:
            if self.execution.status == "exited" and self.failure is None:
                self.execution.status = "stopped"  # the caller is done with it: no exit status to wait for
            self.child.close(self.execution)
        shutil.rmtree(self.base, ignore_errors=True)

