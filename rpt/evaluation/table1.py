"""The RPT paper's Table 1 in one command: HumanEval+, MBPP+ and GSM8K for NTP (k = 0) and RPT
(k = 1, 2) at w = 2, plus the w = 3 rows of App. B.1, each the best over temperatures, with the
relative change against k = 0 (the change in points where k = 0 scores 0); greedy PTP, confidence 0.9
(the sampler's defaults). Every cell carries its number of problems ``n`` and a 95% Wilson interval
(:func:`rpt.statistics.wilson`), or "n too small" below ``rpt.statistics.MIN_N`` problems.

The work is done by the benchmark scripts' skeleton (:func:`rpt.evaluation.benchmark_script.run`), one run
per benchmark and window, each with its own ``--out`` (and so its own resumable store) under the
output folder: ``humaneval_plus_w2.json``, ``mbpp_plus_w2.json``, ``gsm8k_w2.json``, ``..._w3.json``.
Rerunning the command reuses everything already generated or executed. The table reads only
those files.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rpt.cli.devices import check_device
from rpt.cli.output_paths import check_output
from rpt.result_files import save_figure, write_json, write_markdown
from rpt.statistics import LEVEL, MIN_N, wilson_or_none

# (column title, benchmark key, score key in the benchmark's JSON)
COLUMNS = (("HumanEval+", "humaneval_plus", "pass@1"), ("MBPP+", "mbpp_plus", "pass@1"),
           ("GSM8K", "gsm8k", "accuracy"))
PAPER_ITERS = {2: (0, 1, 2), 3: (1, 2)}  # k = 0 does not depend on w: it is measured once, at w = 2


@dataclass(frozen=True)
class Run:
    """One benchmark script run: benchmark key, window, the iterations it sweeps."""

    benchmark: str
    window: int
    iters: tuple[int, ...]

    def out(self, folder: Path) -> Path:
        return folder / f"{self.benchmark}_w{self.window}.json"


def plan(windows: Sequence[int], iters: Sequence[int], benchmarks: Sequence[str]) -> list[Run]:
    """The runs: every benchmark at every window; k = 0 only with the first window."""
    runs = []
    for j, w in enumerate(windows):
        ks = tuple(k for k in iters if k > 0 or j == 0)
        if ks:
            runs += [Run(b, w, ks) for b in benchmarks]
    return runs


def argv_for(run: Run, args: argparse.Namespace) -> list[str]:
    """The benchmark script's command line for ``run``."""
    common = ["--checkpoint", args.checkpoint, "--out", str(run.out(Path(args.out))), "--rpt-window", str(run.window),
              "--rpt-iters", *map(str, run.iters), "--temperatures", *map(str, args.temperatures),
              "--confidence", str(args.confidence), "--batch-size", str(args.batch_size), "--device", args.device,
              "--dtype", args.dtype, "--seed", str(args.seed)]
    if args.limit is not None:
        common += ["--limit", str(args.limit)]
    if args.max_new_tokens is not None:
        common += ["--max-new-tokens", str(args.max_new_tokens)]
    if args.fresh:
        common += ["--fresh"]
    if getattr(args, "chat", False):
        common += ["--chat"]
    if getattr(args, "compile", False):
        common += ["--compile"]
    if run.benchmark == "humaneval_plus":
        return ["--plus", *common, "--isolation", args.isolation, *_data_dir(args)]
    if run.benchmark == "mbpp_plus":
        return [*common, "--isolation", args.isolation, *_data_dir(args)]
    return [*common, *(["--data", args.gsm8k_data] if args.gsm8k_data else []), "--shots", str(args.shots)]


def _data_dir(args) -> list[str]:
    return ["--data-dir", args.evalplus_dir] if args.evalplus_dir else []


def check_args(args: argparse.Namespace) -> None:
    """Every flag of ``eval/table1.py`` before the first run: one ``ValueError`` line naming the flag
    and the fix (a bad value would otherwise stop a benchmark run midway through the table)."""
    check_output(args.out, "--out", directory=True)  # a folder: an existing file is refused, not overwritten
    rules = [("--windows", args.windows, lambda w: w >= 2, "RPT revisits at least one previous token: use w >= 2 "
              "(the paper: 2, and 3 in App. B.1)"),
             ("--rpt-iters", args.rpt_iters, lambda k: k >= 0, "use k >= 0 (0 = NTP)"),
             ("--temperatures", args.temperatures, lambda t: math.isfinite(t) and t >= 0, "use 0 (greedy) or a "
              "positive temperature"),
             ("--confidence", [args.confidence], lambda c: 0 <= c <= 1, "use a probability in [0, 1] (paper: 0.9)"),
             ("--max-new-tokens", [args.max_new_tokens], lambda n: n >= 1, "use an integer >= 1"),
             ("--limit", [] if args.limit is None else [args.limit], lambda n: n >= 1, "use an integer >= 1"),
             ("--batch-size", [args.batch_size], lambda n: n >= 1, "use an integer >= 1"),
             ("--shots", [args.shots], lambda n: n >= 0, "use an integer >= 0")]
    for flag, values, ok, fix in rules:
        for value in values:
            if not ok(value):
                raise ValueError(f"{flag} {value} is invalid: {fix}")
    check_device(args.device)


def chat_probes(benchmarks: Sequence[str]) -> list[list[dict]]:
    """One conversation of each chat convention the table's benchmarks use, rendered before the first
    run: a template that fails on GSM8K's turns stops the table before HumanEval+ is generated."""
    from rpt.evaluation import chat_prompts  # late: only --chat needs the conventions

    probes = []
    if {"humaneval_plus", "mbpp_plus"} & set(benchmarks):
        probes.append(chat_prompts.code_turns("def f(x):\n    return x\n")[0])
    if "gsm8k" in benchmarks:
        probes.append(chat_prompts.gsm8k_turns([("Question: 1 + 1?\nAnswer:", "2")], "Question: 2 + 2?\nAnswer:"))
    return probes


def problems_of(summary: dict, rpt_iters: int, temperature: float) -> int | None:
    """The number of problems behind the setting ``(rpt_iters, temperature)`` of a benchmark run
    (None where the JSON does not say)."""
    rows = [r for r in summary.get("settings", []) if r.get("rpt_iters") == rpt_iters
            and r.get("temperature") == temperature]
    for source in (*rows, summary):
        n = source.get("n_problems", source.get("n"))
        if n is not None:
            return int(n)
    return None


def rows_from(outputs: dict[Run, dict]) -> list[dict]:
    """Table rows ``{window, rpt_iters, <column>: {score, temperature, n, interval}}`` from the runs'
    JSON (``interval``: ``[low, high]``, or None when ``n`` is too small)."""
    cells: dict[tuple[int, int], dict] = {}
    for run, summary in outputs.items():
        title, metric = next((t, m) for t, b, m in COLUMNS if b == run.benchmark)
        for k, best in summary["best_of_temperatures"].items():
            key = (run.window if int(k) > 0 else 0, int(k))
            n = problems_of(summary, int(k), best["temperature"])
            interval = None if n is None else wilson_or_none(best[metric], n)
            cells.setdefault(key, {"window": key[0] or None, "rpt_iters": int(k)})[title] = {
                "score": best[metric], "temperature": best["temperature"], "n": n,
                "interval": list(interval) if interval is not None else None}
    rows = [cells[key] for key in sorted(cells, key=lambda wk: (wk[1] > 0, wk[0], wk[1]))]
    base = next((r for r in rows if r["rpt_iters"] == 0), None)
    for row in rows:
        for title, _, _ in COLUMNS:
            cell = row.get(title)
            if cell is None or base is None or title not in base:
                continue
            ref = base[title]["score"]
            cell["change"] = cell["score"] - ref
            cell["relative_change"] = (cell["score"] - ref) / ref if ref > 0 else None
    return rows


def _fmt(cell: dict | None, relative: bool) -> str:
    """``50.0 [38.2, 61.8], n = 80 (+25.0%)``; ``50.0, n = 2: n too small (-50.0%)``; a change in
    points where the baseline is 0, so never a relative change of a 0 baseline."""
    if cell is None:
        return ""
    text = f"{100 * cell['score']:.1f}"
    if cell.get("interval") is not None:
        low, high = cell["interval"]
        text += f" [{100 * low:.1f}, {100 * high:.1f}], n = {cell['n']}"
    elif cell.get("n") is not None:
        text += f", n = {cell['n']}: n too small"
    elif "n" in cell:
        text += ", n unknown"
    if relative and "change" in cell:
        rel = cell.get("relative_change")
        text += f" ({'+' if cell['change'] >= 0 else ''}{100 * rel:.1f}%)" if rel is not None else \
            f" ({'+' if cell['change'] >= 0 else ''}{100 * cell['change']:.1f} pt)"
    return text


def markdown_rows(rows: list[dict]) -> tuple[list[str], list[list]]:
    headers = ["sampler", "w", "k", *(t for t, _, _ in COLUMNS)]
    body = []
    for row in rows:
        name = "NTP" if row["rpt_iters"] == 0 else "RPT"
        body.append([name, row["window"] or "", row["rpt_iters"],
                     *(_fmt(row.get(t), row["rpt_iters"] > 0) for t, _, _ in COLUMNS)])
    return headers, body


def plot(rows: list[dict], title: str):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0, 3.4))
    ax = fig.add_subplot()
    labels = ["NTP" if r["rpt_iters"] == 0 else f"RPT w={r['window']} k={r['rpt_iters']}" for r in rows]
    width = 0.8 / max(1, len(rows))
    for j, (row, label) in enumerate(zip(rows, labels)):
        xs = [i + (j - (len(rows) - 1) / 2) * width for i in range(len(COLUMNS))]
        ys = [100 * row[t]["score"] if t in row else math.nan for t, _, _ in COLUMNS]
        spans = [row[t].get("interval") if t in row else None for t, _, _ in COLUMNS]
        errors = [[y - 100 * s[0] if s else 0.0 for y, s in zip(ys, spans)],
                  [100 * s[1] - y if s else 0.0 for y, s in zip(ys, spans)]]
        bars = ax.bar(xs, ys, width * 0.95, label=label, yerr=errors, capsize=2, ecolor="0.3")
        ax.bar_label(bars, fmt="%.1f", fontsize=7)
    ax.set_xticks(range(len(COLUMNS)), [t for t, _, _ in COLUMNS])
    ax.set_ylabel(f"score (%), best over temperatures\n(bars: {LEVEL:.0%} Wilson interval)", fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def write_outputs(folder: Path, checkpoint: str, rows: list[dict], runs: list[Run], notes: dict) -> list[Path]:
    table = {"checkpoint": checkpoint, "columns": [t for t, _, _ in COLUMNS],
             "metrics": {t: m for t, _, m in COLUMNS}, "rows": rows, **notes,
             "runs": [{"benchmark": r.benchmark, "window": r.window, "rpt_iters": list(r.iters),
                       "out": str(r.out(folder))} for r in runs]}
    text = (f"Checkpoint `{checkpoint}`. Each cell: the best over temperatures {notes['temperatures']} "
            f"(HumanEval+ / MBPP+: pass@1 on base + extra tests; GSM8K: accuracy, {notes['shots']}-shot), in %; "
            f"[low, high]: the {LEVEL:.0%} Wilson interval over the cell's n problems (\"n too small\" below "
            f"{MIN_N}; it does not account for picking the best temperature, which favours the higher score). "
            "RPT rows: the relative change against NTP (k = 0) in round brackets, or the change in points where NTP "
            f"scores 0. Greedy PTP, confidence {notes['confidence']}. Problems per benchmark: "
            f"{notes['limit'] or 'all'}.")
    return [
        write_json(folder / "table1.json", table),
        write_markdown(folder / "table1.md", "Table 1: NTP vs RPT", [markdown_rows(rows)], text),
        save_figure(plot(rows, f"Table 1 ({checkpoint})"), folder / "table1.png"),
    ]
