"""Score HumanEval completions in the sandbox and report pass@k.

    python eval/humaneval.py --completions canonical --out runs/eval/humaneval.json
    python eval/humaneval.py --completions samples.jsonl --k 1 10 --out runs/eval/he.json

``samples.jsonl`` holds ``{"task_id", "completion"}`` lines, several per task allowed. Writes
``F.json`` (``n_problems``, ``pass@k``, ``results`` in input order), ``F.md`` and ``F.png``;
finished executions are kept in ``F.items.jsonl``, so rerunning on the same ``--out`` resumes.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from tqdm import tqdm

from rpt.evaluation import humaneval as he
from rpt.evaluation.jsonl import EvalInputError, first_groups
from rpt.evaluation.report import ResultStore, bar_plot, sibling, write_json, write_markdown
from rpt.evaluation.sandbox import Limits

DEFAULT_OUT = "runs/eval/humaneval.json"


def add_scoring_args(parser: argparse.ArgumentParser) -> None:
    """Flags of the scoring side (shared by the model-free and, later, the generation path)."""
    parser.add_argument("--completions", required=True,
                        help="'canonical' (the dataset's solutions) or a JSONL file of {task_id, completion}")
    parser.add_argument("--limit", type=int, default=None, help="score only the first N problems")
    parser.add_argument("--out", default=DEFAULT_OUT, help="output JSON; .md/.png/.items.jsonl go beside it")
    parser.add_argument("--k", type=int, nargs="+", default=[1], help="pass@k values to report")
    parser.add_argument("--truncate", action="store_true",
                        help="cut completions at the standard end-of-function stop sequences first")
    parser.add_argument("--timeout", type=float, default=10.0, help="wall-clock seconds per program")
    parser.add_argument("--memory-mb", type=int, default=2048, help="address-space limit per program")
    parser.add_argument("--workers", type=int, default=None, help="parallel programs (default: CPU count)")
    parser.add_argument("--fresh", action="store_true", help="ignore finished items from an earlier run")


def load_records(args: argparse.Namespace, problems: dict[str, dict]) -> list[dict]:
    """The completions to score, in input order (the generation path will plug in here)."""
    if args.completions == "canonical":
        records = he.canonical_records(problems)
    else:
        records = he.read_completions(args.completions, problems)
    records = first_groups(records, "task_id", args.limit)
    if args.truncate:
        records = [{**r, "completion": he.truncate_completion(r["completion"])} for r in records]
    return records


def item_id(record: dict, limits: Limits) -> str:
    """Resume key: the completion and the limits it ran under (a longer --timeout reruns)."""
    return f"{he.record_id(record)}:t{limits.timeout:g}:m{limits.memory_bytes >> 20}"


def score_records(args: argparse.Namespace, problems: dict[str, dict], records: list[dict]) -> list[dict]:
    """Execute the records with a progress bar, reusing results stored by an earlier run."""
    limits = Limits(timeout=args.timeout, memory_bytes=args.memory_mb << 20)
    store = ResultStore(args.out, fresh=args.fresh)
    cached = sum(item_id(r, limits) in store for r in records)
    lock = threading.Lock()
    with tqdm(total=len(records), initial=cached, desc="humaneval", unit="prog") as bar:

        def done(record: dict, result: dict) -> None:
            store.add(item_id(record, limits), result)
            with lock:
                bar.update(1)

        return he.score_completions(
            records,
            problems,
            limits=limits,
            workers=args.workers,
            cached=lambda r: store.get(item_id(r, limits)) if item_id(r, limits) in store else None,
            on_done=done,
        )


def summarise(args: argparse.Namespace, results: list[dict]) -> dict:
    """The output JSON."""
    return {
        "benchmark": "humaneval",
        "completions": args.completions,
        "n_problems": len({r["task_id"] for r in results}),
        "n_samples": len(results),
        **he.pass_at_k(results, args.k),
        "results": results,
    }


def write_outputs(out: str | Path, summary: dict) -> list[Path]:
    """``F.json``, a markdown table ``F.md`` and a pass@k bar plot ``F.png``."""
    metrics = {k: v for k, v in summary.items() if k.startswith("pass@")}
    failures = [(r["task_id"], r["result"]) for r in summary["results"] if not r["passed"]]
    tables = [(["metric", "value"], [("n_problems", summary["n_problems"]), ("n_samples", summary["n_samples"]),
                                     *metrics.items()])]
    if failures:
        tables.append((["failed task_id (first 50)", "result"], failures[:50]))
    return [
        write_json(out, summary),
        write_markdown(sibling(out, ".md"), f"HumanEval ({summary['completions']})", tables),
        bar_plot(sibling(out, ".png"), list(metrics), list(metrics.values()),
                 f"HumanEval: {summary['n_problems']} problems", "pass@k"),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_scoring_args(parser)
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be >= 1")
    if min(args.k) < 1:
        parser.error("--k values must be >= 1")
    try:
        problems = he.load_problems()
        records = load_records(args, problems)
        results = score_records(args, problems, records)
    except (EvalInputError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = summarise(args, results)
    missing = sorted(set(args.k) - {int(k.split("@")[1]) for k in summary if k.startswith("pass@")})
    if missing:
        print(f"note: pass@{missing} not reported: some task has fewer samples than k", file=sys.stderr)
    paths = write_outputs(args.out, summary)
    scores = ", ".join(f"{k} = {v:.4f}" for k, v in summary.items() if k.startswith("pass@"))
    print(f"{summary['n_problems']} problems, {summary['n_samples']} samples: {scores}")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
