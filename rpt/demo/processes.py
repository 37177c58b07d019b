"""How the demo runs a stage's command: in front (:func:`run_command`) or as a background process
beside the following stages (:class:`Background`), from the repository root, offline, with the
thread count a tiny model wants."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the repository: train.py, eval/ and configs/ live there


def _env(threads: int | None = None) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline", TOKENIZERS_PARALLELISM="false")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # sleeping, not spinning, OpenMP threads
    if threads is not None:
        # Decoding a tiny model is latency-bound: one thread is as fast and immune to contention.
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def run_command(cmd: list[str], threads: int | None = None) -> None:
    print("$ " + " ".join(cmd), flush=True)
    res = subprocess.run(cmd, cwd=ROOT, env=_env(threads))
    if res.returncode != 0:
        raise SystemExit(f"demo stage failed (exit {res.returncode}): {' '.join(cmd)}")


class Background:
    """A stage run as a subprocess beside the following ones: a one-thread run on a 2-core machine
    leaves the second core to another (a tiny model gains little from a second thread). Its output
    goes to ``log_path``; ``wait`` returns ``collect()`` once it exited, and its own wall time."""

    def __init__(self, cmd: list[str], log_path: Path, collect, threads: int | None):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.cmd, self.collect, self.log_path = cmd, collect, log_path
        print("$ " + " ".join(cmd) + f"  (in the background, output in {self.log_path})", flush=True)
        self.t0 = time.perf_counter()
        self.log = open(self.log_path, "w")
        # Its own process group: if the demo stops early, stop() ends the run and its training children.
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(threads), stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        # The stage's wall time ends when the process does, not when the demo gets round to collecting it.
        self.seconds: float | None = None
        self.watcher = threading.Thread(target=self._watch, daemon=True)
        self.watcher.start()

    def _watch(self) -> None:
        self.proc.wait()
        self.seconds = time.perf_counter() - self.t0

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait()
        self.log.close()

    def wait(self) -> tuple[Any, float]:
        code = self.proc.wait()
        self.watcher.join()
        self.log.close()
        if code != 0:
            raise SystemExit(f"demo stage failed (exit {code}): {' '.join(self.cmd)}; see {self.log_path}")
        return self.collect(), self.seconds

