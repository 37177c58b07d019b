"""The one skeleton of the benchmark scripts (``eval/humaneval.py``, ``eval/mbpp.py``, ``eval/gsm8k.py``).

A script is a :class:`Benchmark` plus ``sys.exit(run(benchmark))``. The skeleton owns what they
share:

* **arguments**: the source (``--checkpoint`` to generate, or ``--completions`` to score given
  ones), ``--limit``, ``--out``, ``--fresh``; the model flags; the sweep (``--rpt-iters`` x
  ``--temperatures``) and every other ``SamplingConfig`` flag of ``sample.py``; then the
  benchmark's own;
* **source checks**: exactly one source, positive ``--limit`` / ``--batch-size``, bad sampling
  flags before the model is loaded; every bad input is one ``error: ...`` line and exit status 2,
  with nothing written;
* **a resumable store**: generations (and, for the code benchmarks, executions) are appended to
  ``F.items.jsonl`` as they finish, and a rerun on the same ``--out`` reuses them;
* **the report**: ``F.json`` (the benchmark's metrics; with ``--checkpoint`` a row per setting and
  the best over temperatures per ``rpt_iters``, the paper's figure), ``F.md`` and ``F.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

from rpt.checkpoint.model_ref import ModelRefError, resolve_model_ref
from rpt.cli.devices import check_device
from rpt.cli.model_args import add_model_args
from rpt.cli.output_paths import REPORT_SIBLINGS, output_problem
from rpt.cli.parser import report_input_error
from rpt.evaluation import sweep
from rpt.evaluation.batched_generation import check_source_args, load_checkpoint
from rpt.evaluation.user_jsonl import EvalInputError, select_tasks
from rpt.result_files import (
    ResultStore,
    bar_plot,
    save_figure,
    sibling,
    write_json,
    write_markdown,
)
from rpt.sampling.entry_defaults import explain_defaults
from rpt.sampling.flags import add_sampling_args, sampling_config_from_args
from rpt.sampling.loading import check_checkpoint, load_tokenizer
from rpt.sampling.text import chat
from rpt.sampling.text.chat import CHAT_HELP, add_chat_arg
from rpt.sandbox import IsolationUnavailable


class Benchmark:
    """What a benchmark script specifies; the skeleton (:func:`run`) does the rest.

    ``id_field`` names a record's problem id (``task_id`` / ``idx``); ``metric`` is the headline
    score (best over temperatures, plotted); ``given`` documents ``--completions``' keyword
    (``canonical`` / ``gold``).
    """

    name = "benchmark"
    title = "Benchmark"
    description = ""
    default_out = "runs/eval/benchmark.json"
    id_field = "task_id"
    metric = "pass@1"
    given = "canonical"
    token_healing = False
    chat_prompt = ""  # what --chat asks (for --help)
    script: str | None = None  # the entry point's path, e.g. "eval/gsm8k.py" (rpt.sampling.entry_defaults)

    def add_args(self, parser: argparse.ArgumentParser) -> None:
        """The benchmark's own flags."""

    def check_args(self, parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        """Argument checks beyond the skeleton's (``parser.error`` for a bad one)."""

    def load(self, args: argparse.Namespace):
        """The problems (raise :class:`EvalInputError` for bad data)."""
        raise NotImplementedError

    def given_records(self, args: argparse.Namespace, problems) -> list[dict]:
        """``--completions``: every record of the file (or keyword), ``{id_field, completion}``, in input
        order, each naming a task of ``problems``; the skeleton applies ``--limit``."""
        raise NotImplementedError

    def task_ids(self, problems) -> list:
        """The benchmark's task ids in its own order (``--limit N``: the first N of them)."""
        return list(problems)

    def check_records(self, args: argparse.Namespace, records: list[dict]) -> None:
        """Refuse (:class:`EvalInputError`) records the metrics could not be computed from, before any
        of them is scored."""

    def items(self, args: argparse.Namespace, problems) -> list[dict]:
        """``--checkpoint``: ``{"id", "prompt"}`` per problem to generate for (``--limit`` applied); under
        ``--chat`` ``{"id", "messages"[, "reply_prefix"]}``, rendered with the tokenizer's chat template."""
        raise NotImplementedError

    def stop(self, args: argparse.Namespace) -> list[str]:
        """Stop strings of generation."""
        return []

    def record(self, item_id, completion: str) -> dict:
        """A generated completion as a record to score (cut where the benchmark ends it)."""
        return {self.id_field: item_id, "completion": completion}

    def score(self, args: argparse.Namespace, problems, records: list[dict], store: ResultStore) -> list[dict]:
        """Results in input order (at least ``id_field``, ``completion`` and a pass/correct flag)."""
        raise NotImplementedError

    def metrics(self, args: argparse.Namespace, results: list[dict]) -> dict:
        """The scores of ``results`` (the headline ``metric`` among them), for JSON and tables."""
        raise NotImplementedError

    def sample_files(self, args: argparse.Namespace, records: dict[str | None, list[dict]]) -> list[Path]:
        """Files of the scored records in another tool's format (per setting name; None: the given
        completions), written atomically; the paths written."""
        return []

    def too_long_fix(self, args: argparse.Namespace) -> str:
        """What to do when a prompt fills the model's context (the end of that error line)."""
        return "shorten it"

    def header(self, args: argparse.Namespace) -> dict:
        """Extra top-level JSON keys (data file, shots, ...)."""
        return {}

    def failures(self, results: list[dict]) -> tuple[list[str], list[list]]:
        """Markdown table of what went wrong (first 50)."""
        bad = [r for r in results if not r.get("passed", r.get("correct"))]
        return [f"failed {self.id_field} (first 50)", "result"], [[r[self.id_field], r.get("result", "")] for r in bad[:50]]


def build_parser(benchmark: Benchmark) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=benchmark.description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--completions", default=None,
                        help=f"'{benchmark.given}' or a JSONL file of {{{benchmark.id_field}, completion}}; "
                             "instead of --checkpoint")
    parser.add_argument("--limit", type=int, default=None, help="only the first N problems")
    parser.add_argument("--out", default=benchmark.default_out, help="output JSON; .md/.png/.items.jsonl go beside it")
    parser.add_argument("--fresh", action="store_true", help="ignore finished items of an earlier run on this --out")
    group = add_model_args(parser, required=False)  # --checkpoint or --completions
    add_chat_arg(group, f"{CHAT_HELP}. {benchmark.chat_prompt}")
    benchmark.add_args(parser)
    sweep.add_sweep_args(parser)
    add_sampling_args(parser, exclude=sweep.SWEPT_KNOBS)
    parser.set_defaults(token_healing=benchmark.token_healing)
    return explain_defaults(parser, benchmark.script) if benchmark.script else parser


def run(benchmark: Benchmark, argv: Sequence[str] | None = None) -> int:
    """The whole script: parse, check, score given completions or generate-and-score, report."""
    parser = build_parser(benchmark)
    args = parser.parse_args(argv)
    check_source_args(parser, args)
    try:
        if args.chat and args.completions is not None:
            raise EvalInputError("--chat builds the prompts of generation (--checkpoint); --completions are scored as "
                                 "given (whole programs as {task_id, solution} lines): drop --chat")
        problem = output_problem(args.out, "--out", siblings=REPORT_SIBLINGS)
        if problem is not None:  # before any work: a bad --out would otherwise fail only at the end
            raise EvalInputError(problem)
        if args.checkpoint is not None:
            check_device(args.device)
        benchmark.check_args(parser, args)
        problems = benchmark.load(args)
        if args.completions is not None:
            return _run_given(benchmark, args, problems)
        return _run_checkpoint(benchmark, args, problems)
    except (EvalInputError, IsolationUnavailable, ValueError, FileNotFoundError) as exc:
        return report_input_error(exc, traceback_hint=False)


def _scores(row: dict) -> str:
    """The scores of a settings row: pass@k / accuracy, and base / plus pass@k where there are."""
    parts = [f"{k} = {v:.4f}" for k, v in row.items() if k.startswith("pass@") or k == "accuracy"]
    parts += [f"{split} {k} = {v:.4f}" for split in ("base", "plus") if isinstance(row.get(split), dict)
              for k, v in row[split].items()]
    return ", ".join(parts)


def _run_given(benchmark: Benchmark, args: argparse.Namespace, problems) -> int:
    records, coverage = select_tasks(benchmark.given_records(args, problems), benchmark.id_field,
                                     benchmark.task_ids(problems), args.limit)
    scope = "all tasks" if args.limit is None else f"the first {args.limit} tasks"
    if not records:
        raise EvalInputError(f"--completions {args.completions} has no completion for {scope} of {benchmark.title} "
                             f"(its {coverage['ignored_completions']} are for later tasks); raise --limit or drop it")
    if coverage["ignored_completions"]:
        n = coverage["ignored_completions"]
        print(f"note: {n} completion{'s' * (n != 1)} of {args.completions} for tasks past --limit {args.limit} "
              "not scored", file=sys.stderr)
    if coverage["tasks_without_completion"] and args.limit is not None:
        # --limit N scores the benchmark's first N tasks: a file that leaves one out would score it as
        # absent from the benchmark, not as failed, so it is refused (without --limit the file's own tasks are scored)
        raise EvalInputError(f"--completions {args.completions} has no completion for {coverage['tasks_without_completion']} "
                             f"of {scope} (first: {', '.join(map(str, coverage['first_without_completion']))}); "
                             f"add them, or lower --limit")
    benchmark.check_records(args, records)
    store = ResultStore(args.out, fresh=args.fresh)
    results = benchmark.score(args, problems, records, store)
    summary = {"benchmark": benchmark.name, "completions": args.completions, "limit": args.limit,
               **benchmark.header(args), **benchmark.metrics(args, results),
               "ignored_completions": coverage["ignored_completions"],
               "tasks_without_completion": coverage["tasks_without_completion"], "results": results}
    metrics = _metric_rows(summary)
    tables = [(["metric", "value"], metrics)]
    failures = benchmark.failures(results)
    if failures[1]:
        tables.append(failures)
    headline = [(k, v) for k, v in metrics if isinstance(v, float)]
    paths = [
        write_json(args.out, summary),
        write_markdown(sibling(args.out, ".md"), f"{benchmark.title} ({args.completions})", tables),
        bar_plot(sibling(args.out, ".png"), [k for k, _ in headline], [v for _, v in headline], benchmark.title,
                 "score"),
        *benchmark.sample_files(args, {None: records}),
    ]
    print(_summary_line(summary))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def _metric_rows(summary: dict) -> list[tuple[str, object]]:
    """Flat ``(name, value)`` rows of the numbers in ``summary`` (``base.pass@1`` for nested ones)."""
    rows = []
    for key, value in summary.items():
        if key in ("results", "settings", "best_of_temperatures", "sampling"):
            continue
        if isinstance(value, dict):
            rows += [(f"{key} {k}", v) for k, v in value.items() if isinstance(v, (int, float))]
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            rows.append((key, value))
    return rows


def _summary_line(summary: dict) -> str:
    return ", ".join(f"{k} = {v:.4f}" if isinstance(v, float) else f"{k} = {v}" for k, v in _metric_rows(summary))


def _run_checkpoint(benchmark: Benchmark, args: argparse.Namespace, problems) -> int:
    settings = sweep.sweep_settings(args.rpt_iters, args.temperatures)
    stop = [*benchmark.stop(args), *(args.stop or [])]
    sampling_config_from_args(args, stop=stop, rpt_iters=0, temperature=0.0)  # bad flags first, before loading
    items = benchmark.items(args, problems)
    try:  # before the store is opened: a bad reference leaves nothing behind
        args.checkpoint = resolve_model_ref(args.checkpoint, "--checkpoint", "train one first or check the path")
    except ModelRefError as e:
        raise EvalInputError(str(e)) from None
    if args.chat:  # every prompt rendered before the model loads and anything is written
        tokenizer = load_tokenizer(args.checkpoint)
        chat.require_chat_template(tokenizer, args.checkpoint)
        items = [{"id": it["id"], "prompt": chat.render(tokenizer, it["messages"], it.get("reply_prefix", ""))}
                 for it in items]
    store = sweep.open_store(args.out, fresh=args.fresh)
    model, tokenizer, window = load_checkpoint(args.checkpoint, sweep.process_device(args.device), args.dtype)
    base = sampling_config_from_args(args, tokenizer, stop=stop, rpt_iters=0, temperature=0.0)
    for setting in settings:
        check_checkpoint(window, setting.config(base), args.checkpoint)
    n_samples = getattr(args, "n_samples", 1)
    generated = sweep.generate_sweep(model, tokenizer, items, settings, base, checkpoint=args.checkpoint, store=store,
                                     n_samples=n_samples, batch_size=args.batch_size,
                                     desc=f"{benchmark.name} generate", too_long=benchmark.too_long_fix(args),
                                     compile=args.compile)
    if not sweep.is_main_process():
        return 0
    records = {s.name: [benchmark.record(g["id"], g["completion"]) for g in generated[s.name]] for s in settings}
    everything = [r for s in settings for r in records[s.name]]
    results = benchmark.score(args, problems, everything, store)
    rows, at = [], 0
    for setting in settings:
        gen = generated[setting.name]
        mine = [{**r, "sample": g["sample"], "finish_reason": g["finish_reason"]}
                for g, r in zip(gen, results[at : at + len(gen)])]
        at += len(gen)
        rows.append({**setting.as_dict(), **benchmark.metrics(args, mine), **sweep.decoding_stats(gen), "results": mine})
    first = rows[0]
    config = {k: v for k, v in dataclasses.asdict(base).items() if k not in sweep.SWEPT_KNOBS}
    headline = {k: v for k, v in first.items() if k not in ("name", "rpt_iters", "temperature", "results")
                and k not in sweep.decoding_stats(generated[settings[0].name])}
    summary = {
        "benchmark": benchmark.name, "checkpoint": args.checkpoint, "chat": args.chat, **benchmark.header(args),
        "sampling": config,
        "samples_per_task": n_samples, "first_setting": settings[0].name, **headline,
        "best_of_temperatures": sweep.best_of_temperatures(rows, benchmark.metric),
        "settings": rows, "results": first["results"],
    }
    metrics = list(dict.fromkeys(k for row in rows for k in row if k == benchmark.metric or k.startswith("pass@")
                                 or k == "accuracy"))
    extra = [k for k in ("base", "plus") if k in first]
    table = sweep.settings_table(rows, metrics)
    if extra:  # base / plus pass@1 beside the headline
        table = ([*table[0][:2], *[f"{k} pass@1" for k in extra], *table[0][2:]],
                 [[*line[:2], *[row[k].get("pass@1", "") for k in extra], *line[2:]] for line, row in zip(table[1], rows)])
    notes = (f"Checkpoint `{args.checkpoint}`{' (chat template)' if args.chat else ''}: {len(items)} problems, "
             f"{n_samples} sample(s) per problem, at most "
             f"{config['max_new_tokens']} new tokens, token healing {'on' if config['token_healing'] else 'off'}. "
             "tokens/s: decoding throughput per process.")
    paths = [
        write_json(args.out, summary),
        write_markdown(sibling(args.out, ".md"), benchmark.title,
                       [table, sweep.best_table(summary["best_of_temperatures"], benchmark.metric)], notes),
        save_figure(sweep.plot_sweep(rows, benchmark.metric, f"{benchmark.title} {benchmark.metric}: {len(items)} problems"),
                    sibling(args.out, ".png")),
        *benchmark.sample_files(args, records),
    ]
    for row in rows:
        print(f"{row['name']}: {_scores(row)} ({row['tokens_per_s']:.1f} tokens/s, {row['corrections']} corrections)")
        note = sweep.fallback_note(row["name"], row["decoded_by"])
        if note is not None:
            print(note)
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
