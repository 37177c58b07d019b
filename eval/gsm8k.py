"""Score GSM8K completions: answer extraction and numeric comparison, no model needed.

    python eval/gsm8k.py --completions gold --data ../shared/data/gsm8k/test.jsonl
    python eval/gsm8k.py --completions answers.jsonl --data test.jsonl --out runs/eval/gsm8k.json

``answers.jsonl`` holds ``{"idx", "completion"}`` lines, ``idx`` indexing the evaluated split;
the completion is what followed ``Answer:`` and is cut at the next ``Question:``. Without
``--data`` the split comes from the hub (``openai/gsm8k``, needs network or a warm cache).
Writes ``F.json`` (``n``, ``accuracy``, ``results`` in input order), ``F.md`` and ``F.png``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from rpt.evaluation import gsm8k
from rpt.evaluation.jsonl import EvalInputError, first_groups
from rpt.evaluation.report import bar_plot, sibling, write_json, write_markdown

DEFAULT_OUT = "runs/eval/gsm8k.json"


def add_scoring_args(parser: argparse.ArgumentParser) -> None:
    """Flags of the scoring side (shared by the model-free and, later, the generation path)."""
    parser.add_argument("--completions", required=True,
                        help="'gold' (the reference solutions) or a JSONL file of {idx, completion}")
    parser.add_argument("--data", default=None, help="local JSONL of {question, answer}; default: the hub")
    parser.add_argument("--split", default="test", help="hub split when --data is not given")
    parser.add_argument("--limit", type=int, default=None, help="score only the first N problems")
    parser.add_argument("--out", default=DEFAULT_OUT, help="output JSON; .md/.png go beside it")


def load_records(args: argparse.Namespace, problems: list[dict]) -> list[dict]:
    """The completions to score, in input order (the generation path will plug in here)."""
    if args.completions == "gold":
        records = [{"idx": i, "completion": gsm8k.gold_completion(p["answer"])} for i, p in enumerate(problems)]
    else:
        records = gsm8k.read_completions(args.completions, len(problems))
    return first_groups(records, "idx", args.limit)


def score_records(records: list[dict], problems: list[dict]) -> list[dict]:
    """Score with a progress bar; results in input order."""
    return [gsm8k.score([r], problems)[0] for r in tqdm(records, desc="gsm8k", unit="answer")]


def summarise(args: argparse.Namespace, results: list[dict]) -> dict:
    """The output JSON."""
    n = len(results)
    return {
        "benchmark": "gsm8k",
        "completions": args.completions,
        "data": args.data or f"hub:{'/'.join(gsm8k.HUB_DATASET)}:{args.split}",
        "n": n,
        "accuracy": sum(r["correct"] for r in results) / n if n else 0.0,
        "results": results,
    }


def write_outputs(out: str | Path, summary: dict) -> list[Path]:
    """``F.json``, a markdown table ``F.md`` and an accuracy bar ``F.png``."""
    wrong = [(r["idx"], r["prediction"], r["gold"]) for r in summary["results"] if not r["correct"]]
    tables = [(["metric", "value"], [("n", summary["n"]), ("accuracy", summary["accuracy"])])]
    if wrong:
        tables.append((["wrong idx (first 50)", "prediction", "gold"], wrong[:50]))
    return [
        write_json(out, summary),
        write_markdown(sibling(out, ".md"), f"GSM8K ({summary['completions']})", tables),
        bar_plot(sibling(out, ".png"), ["accuracy"], [summary["accuracy"]], f"GSM8K: n = {summary['n']}",
                 "accuracy"),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_scoring_args(parser)
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be >= 1")
    try:
        problems = gsm8k.load_gsm8k(args.data, args.split)
        results = score_records(load_records(args, problems), problems)
    except EvalInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = summarise(args, results)
    paths = write_outputs(args.out, summary)
    print(f"n = {summary['n']}, accuracy = {summary['accuracy']:.4f}")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
