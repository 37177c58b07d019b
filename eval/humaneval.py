"""HumanEval: generate with a checkpoint (or take given completions), run them in the sandbox, report pass@k.

    python eval/humaneval.py --checkpoint runs/demo/rpt/final --rpt-iters 0 1 2 --temperatures 0 0.05 0.1
    python eval/humaneval.py --checkpoint DIR --n-samples 10 --temperatures 0.1 --k 1 10 --limit 20
    accelerate launch eval/humaneval.py --checkpoint DIR --rpt-iters 0 1 2
    python eval/humaneval.py --completions canonical --out runs/eval/humaneval.json
    python eval/humaneval.py --completions samples.jsonl --k 1 10 --out runs/eval/he.json

``--checkpoint``: for every setting of the sweep (``--rpt-iters`` x ``--temperatures``) each task's
prompt is completed ``--n-samples`` times (token healing on unless ``--no-token-healing``; stop at
the end of the function), truncated there and executed. Every flag of ``sample.py`` applies.
``F.json``: per setting (``settings``) pass@k, decoding stats and ``results``; ``best_of_temperatures``
(per ``rpt_iters`` the best pass@1 over temperatures, the paper's figure); and, for the first
setting, the top-level ``n_problems``, ``pass@k`` and ``results``.

``--completions``: ``canonical`` (the dataset's solutions) or ``samples.jsonl`` with
``{"task_id", "completion"}`` lines, several per task allowed, scored without a model. ``F.json``:
``n_problems``, ``pass@k``, ``results`` in input order.

Both write ``F.md`` and ``F.png`` beside ``F.json``; generated completions and finished
executions are kept in ``F.items.jsonl``, so rerunning on the same ``--out`` resumes.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import threading
from pathlib import Path

from tqdm import tqdm

from rpt.evaluation import humaneval as he
from rpt.evaluation import sweep
from rpt.evaluation.generation import add_model_args, check_source_args, load_checkpoint
from rpt.evaluation.jsonl import EvalInputError, first_groups
from rpt.evaluation.report import ResultStore, bar_plot, save_figure, sibling, write_json, write_markdown
from rpt.evaluation.sandbox import Limits
from rpt.sampling.cli import add_sampling_args, sampling_config_from_args
from rpt.sampling.loading import check_checkpoint

DEFAULT_OUT = "runs/eval/humaneval.json"


def add_scoring_args(parser: argparse.ArgumentParser) -> None:
    """Flags of the scoring side (shared by the model-free and the generation path)."""
    parser.add_argument("--completions", default=None,
                        help="'canonical' (the dataset's solutions) or a JSONL file of {task_id, completion}; "
                             "instead of --checkpoint")
    parser.add_argument("--limit", type=int, default=None, help="score only the first N problems")
    parser.add_argument("--out", default=DEFAULT_OUT, help="output JSON; .md/.png/.items.jsonl go beside it")
    parser.add_argument("--k", type=int, nargs="+", default=[1], help="pass@k values to report")
    parser.add_argument("--truncate", action="store_true",
                        help="cut given completions at the standard end-of-function stop sequences first "
                             "(generated ones always are)")
    parser.add_argument("--timeout", type=float, default=10.0, help="wall-clock seconds per program")
    parser.add_argument("--memory-mb", type=int, default=2048, help="address-space limit per program")
    parser.add_argument("--workers", type=int, default=None, help="parallel programs (default: CPU count)")
    parser.add_argument("--fresh", action="store_true", help="ignore finished items from an earlier run")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_scoring_args(parser)
    add_model_args(parser, required=False)
    parser.add_argument("--n-samples", type=int, default=1, help="completions per task and setting (for pass@k)")
    sweep.add_sweep_args(parser)
    add_sampling_args(parser, exclude=sweep.SWEPT_KNOBS)
    parser.set_defaults(token_healing=True)  # HumanEval prompts end mid-line: heal the boundary
    return parser


def load_records(args: argparse.Namespace, problems: dict[str, dict]) -> list[dict]:
    """The given completions to score (``--completions``), in input order."""
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


def score_records(args: argparse.Namespace, problems: dict[str, dict], records: list[dict],
                  store: ResultStore | None = None) -> list[dict]:
    """Execute the records with a progress bar, reusing results stored by an earlier run."""
    limits = Limits(timeout=args.timeout, memory_bytes=args.memory_mb << 20)
    store = store if store is not None else ResultStore(args.out, fresh=args.fresh)
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


def run_completions(args: argparse.Namespace) -> int:
    """``--completions``: score given completions, no model."""
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


def generate_completions(args: argparse.Namespace, problems: dict[str, dict], store: ResultStore):
    """``(settings, base config, setting name -> generated records)`` for the first ``--limit`` tasks."""
    settings = sweep.sweep_settings(args.rpt_iters, args.temperatures)
    stop = [*he.STOP_SEQUENCES, *(args.stop or [])]
    sampling_config_from_args(args, stop=stop, rpt_iters=0, temperature=0.0)  # bad flags first, before loading
    model, tokenizer, window = load_checkpoint(args.checkpoint, sweep.process_device(args.device), args.dtype)
    base = sampling_config_from_args(args, tokenizer, stop=stop, rpt_iters=0, temperature=0.0)
    for setting in settings:
        check_checkpoint(window, setting.config(base), args.checkpoint)
    items = [{"id": tid, "prompt": problems[tid]["prompt"]} for tid in list(problems)[: args.limit]]
    generated = sweep.generate_sweep(model, tokenizer, items, settings, base, checkpoint=args.checkpoint, store=store,
                                     n_samples=args.n_samples, batch_size=args.batch_size, desc="humaneval generate")
    return settings, base, generated


def summarise_sweep(args: argparse.Namespace, settings, base, generated: dict, results: list[dict]) -> dict:
    """The output JSON of a ``--checkpoint`` run; ``results`` holds every setting's, in setting order."""
    rows, at = [], 0
    for setting in settings:
        gen = generated[setting.name]
        mine = [{**r, "sample": g["sample"], "finish_reason": g["finish_reason"]}
                for g, r in zip(gen, results[at : at + len(gen)])]
        at += len(gen)
        rows.append({**setting.as_dict(), **he.pass_at_k(mine, args.k), "n_samples": len(mine),
                     **sweep.decoding_stats(gen), "results": mine})
    first = rows[0]
    config = {k: v for k, v in dataclasses.asdict(base).items() if k not in sweep.SWEPT_KNOBS}
    return {
        "benchmark": "humaneval",
        "checkpoint": args.checkpoint,
        "sampling": config,
        "n_problems": len({r["task_id"] for r in first["results"]}),
        "n_samples": len(first["results"]),
        "samples_per_task": args.n_samples,
        "first_setting": settings[0].name,
        **{k: v for k, v in first.items() if k.startswith("pass@")},
        "best_of_temperatures": sweep.best_of_temperatures(rows, "pass@1"),
        "settings": rows,
        "results": first["results"],
    }


def write_sweep_outputs(out: str | Path, summary: dict) -> list[Path]:
    """``F.json``, ``F.md`` (a line per setting, best over temperatures) and ``F.png``."""
    metrics = list(dict.fromkeys(k for row in summary["settings"] for k in row if k.startswith("pass@")))
    notes = (f"Checkpoint `{summary['checkpoint']}`: {summary['n_problems']} problems, {summary['samples_per_task']} "
             f"sample(s) per task, at most {summary['sampling']['max_new_tokens']} new tokens, token healing "
             f"{'on' if summary['sampling']['token_healing'] else 'off'}. tokens/s: decoding throughput per process.")
    return [
        write_json(out, summary),
        write_markdown(sibling(out, ".md"), "HumanEval", [sweep.settings_table(summary["settings"], metrics),
                                                          sweep.best_table(summary["best_of_temperatures"], "pass@1")],
                       notes),
        save_figure(sweep.plot_sweep(summary["settings"], "pass@1",
                                     f"HumanEval pass@1: {summary['n_problems']} problems"), sibling(out, ".png")),
    ]


def run_checkpoint(args: argparse.Namespace) -> int:
    """``--checkpoint``: generate every setting's completions, then score them all."""
    try:
        problems = he.load_problems()
        store = sweep.open_store(args.out, fresh=args.fresh)
        settings, base, generated = generate_completions(args, problems, store)
    except (EvalInputError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not sweep.is_main_process():
        return 0
    records = [{"task_id": g["id"], "completion": he.truncate_completion(g["completion"])}
               for s in settings for g in generated[s.name]]
    unique = list({he.record_id(r): r for r in records}.values())  # settings often agree: run each program once
    scored = {he.record_id(r): r for r in score_records(args, problems, unique, store=store)}
    summary = summarise_sweep(args, settings, base, generated, [scored[he.record_id(r)] for r in records])
    paths = write_sweep_outputs(args.out, summary)
    for row in summary["settings"]:
        scores = ", ".join(f"{k} = {v:.4f}" for k, v in row.items() if k.startswith("pass@"))
        print(f"{row['name']}: {scores} ({row['tokens_per_s']:.1f} tokens/s, {row['corrections']} corrections)")
    missing = sorted(set(args.k) - {int(k.split("@")[1]) for k in summary if k.startswith("pass@")})
    if missing:
        print(f"note: pass@{missing} not reported: fewer samples per task than k (raise --n-samples)", file=sys.stderr)
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_source_args(parser, args)
    if min(args.k) < 1:
        parser.error("--k values must be >= 1")
    if args.n_samples < 1:
        parser.error("--n-samples must be >= 1")
    return run_completions(args) if args.completions is not None else run_checkpoint(args)


if __name__ == "__main__":
    sys.exit(main())
