"""What the vLLM benchmarks (``vllm_lz.py``, ``vllm_rpt.py``) share: their flags, and the rounds.

Each (arm, batch) round is a fresh subprocess of the benchmark script (one engine per process) that
prints its row as the last line of JSON; the arms are alternated, their order flipped every round.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence

# vLLM on the CPU in one process, its OpenMP threads unbound, a 2 GiB KV cache
ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "2"}


def parse_args(description: str, arms: Sequence[str], *, rounds: int, repeats: int, new: int,
               model: str) -> argparse.Namespace:
    """The benchmark's flags (its defaults given), and the hidden ``--arm`` / ``--batch`` of a child round."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--repeats", type=int, default=repeats)
    ap.add_argument("--new", type=int, default=new)
    ap.add_argument("--model", default=model)
    ap.add_argument("--arm", choices=arms, help=argparse.SUPPRESS)  # a child round
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    return ap.parse_args()


def run_rounds(script: str, args: argparse.Namespace, arms: Sequence[str],
               show: Callable[[int, int, str, dict], str]) -> dict[tuple[str, int], list[dict]]:
    """Every round of ``script``'s arms at every batch: ``{(arm, batch): [row per round]}``; ``show(round, batch,
    arm, row)`` is the line printed as a round ends. A failed round ends the run with its stderr."""
    env = dict(os.environ, **ENGINE_ENV)
    results: dict[tuple[str, int], list[dict]] = {}
    for r in range(args.rounds):
        for batch in args.batches:
            for arm in arms if r % 2 == 0 else arms[::-1]:  # alternated, and the order flipped every round
                cmd = [sys.executable, script, "--arm", arm, "--batch", str(batch), "--model", args.model,
                       "--repeats", str(args.repeats), "--new", str(args.new)]
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
                if out.returncode != 0:
                    sys.exit(f"round {arm} batch {batch} failed:\n{out.stderr[-3000:]}")
                row = json.loads(out.stdout.strip().splitlines()[-1])
                results.setdefault((arm, batch), []).append(row)
                print(show(r, batch, arm, row), flush=True)
    return results
