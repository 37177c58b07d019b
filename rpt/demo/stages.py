"""The demo's stages, run once each: a stage's result and wall time persist in
``<out>/stages/<name>.json`` and a rerun reads them back instead of running it again; stages may
run in the background, and several side by side."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rpt.demo.processes import Background
from rpt.result_files import write_json


class Stages:
    """Runs named stages once; results and wall times persist in ``<out>/stages``."""

    def __init__(self, out: Path):
        self.dir = out / "stages"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.results: dict[str, Any] = {}
        self.seconds: dict[str, float] = {}

    def _cached(self, name: str) -> bool:
        path = self.dir / f"{name}.json"
        if not path.exists():
            return False
        saved = json.loads(path.read_text())
        print(f"[demo] {name}: cached ({saved['seconds']:.0f} s when it ran)", flush=True)
        self.results[name], self.seconds[name] = saved["result"], saved["seconds"]
        return True

    def _save(self, name: str, result: Any, seconds: float) -> Any:
        write_json(self.dir / f"{name}.json", {"result": result, "seconds": seconds})
        self.results[name], self.seconds[name] = result, seconds
        return result

    def __call__(self, name: str, fn) -> Any:
        if self._cached(name):
            return self.results[name]
        print(f"\n[demo] ===== {name} =====", flush=True)
        t0 = time.perf_counter()
        result = fn()
        return self._save(name, result, time.perf_counter() - t0)

    def start(self, name: str, cmd: list[str], log_path: Path, collect, threads: int | None = None) -> Background | None:
        """Start stage ``name`` in the background unless it is cached; :meth:`finish` collects it."""
        if (self.dir / f"{name}.json").exists():
            return None
        print(f"\n[demo] ===== {name} (started in the background) =====", flush=True)
        return Background(cmd, log_path, collect, threads)

    def finish(self, name: str, pending: Background | None) -> Any:
        if pending is None and self._cached(name):
            return self.results[name]
        print(f"\n[demo] ===== {name}: waiting for the background run =====", flush=True)
        return self._save(name, *pending.wait())


def side_by_side(stages: Stages, runs: dict[str, tuple[list[str], Path, Any]]) -> None:
    """Run the uncached stages of ``runs`` (name -> command, log, collect) at once, one thread each."""
    pending = {name: stages.start(name, cmd, log, collect, threads=1) for name, (cmd, log, collect) in runs.items()}
    try:
        for name, run in pending.items():
            stages.finish(name, run)
    finally:
        for run in pending.values():
            if run is not None:
                run.stop()  # a no-op once it finished; ends the other if one failed

