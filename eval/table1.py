"""The RPT paper's Table 1 in one command (HumanEval+, MBPP+, GSM8K; NTP vs RPT k = 1, 2 at w = 2,
and the w = 3 rows of App. B.1; best over temperatures 0, 0.05, 0.1; greedy PTP, confidence 0.9).

    python eval/table1.py --checkpoint runs/demo/rpt/final --out runs/table1
    python eval/table1.py --checkpoint DIR --limit 20 --max-new-tokens 256 --out runs/table1_small

Each cell: the best score over temperatures, its number of problems n and a 95% Wilson interval ("n
too small" below 10 problems); RPT rows add the relative change against NTP (in points where NTP
scores 0). Writes ``OUT/table1.json``, ``OUT/table1.md``, ``OUT/table1.png`` and, per benchmark and window,
the benchmark script's own ``OUT/<benchmark>_w<w>.json`` (+ ``.md``, ``.png``, ``.items.jsonl``).
Resumable: rerunning the command reuses every generation and execution already stored. A
checkpoint trained with a window smaller than 3 gets the w = 2 rows only (with a note).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rpt.checkpoint.model_ref import resolve_model_ref
from rpt.cli.model_args import add_model_args
from rpt.cli.parser import report_input_error
from rpt.evaluation import table1
from rpt.evaluation.benchmark_script import run
from rpt.evaluation.code_benchmarks import HumanEval, MBPPPlus
from rpt.evaluation.gsm8k import GSM8K
from rpt.sampling.config import SamplingConfig
from rpt.sampling.entry_defaults import TABLE1, explain_defaults
from rpt.sampling.loading import load_tokenizer, rpt_window_of
from rpt.sampling.text.chat import CHAT_HELP, add_chat_arg, require_chat_template
from rpt.sandbox import ISOLATION_MODES

BENCHMARKS = {"humaneval_plus": HumanEval, "mbpp_plus": MBPPPlus, "gsm8k": GSM8K}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = add_model_args(parser)
    parser.add_argument("--out", default="runs/table1", help="output folder")
    parser.add_argument("--windows", type=int, nargs="+", default=[2, 3], help="RPT windows w (paper: 2, and 3 in B.1)")
    parser.add_argument("--rpt-iters", type=int, nargs="+", default=[0, 1, 2], help="k values (0 = NTP)")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.05, 0.1])
    parser.add_argument("--confidence", type=float, default=0.9, help="eta of greedy PTP (paper: 0.9)")
    parser.add_argument("--benchmarks", nargs="+", default=list(BENCHMARKS), choices=list(BENCHMARKS))
    parser.add_argument("--limit", type=int, default=None, help="first N problems of each benchmark")
    parser.add_argument("--max-new-tokens", type=int, default=SamplingConfig().max_new_tokens,
                        help="maximum new tokens per answer (default: %(default)s, the sampler's)")
    parser.add_argument("--gsm8k-data", default=None,
                        help="GSM8K test JSONL (train.jsonl beside it gives the shots); default: as eval/gsm8k.py's "
                             "--data, the local copy ($RPT_GSM8K_DIR, else ../shared/data/gsm8k), else the hub")
    parser.add_argument("--shots", type=int, default=8, help="GSM8K few-shot examples")
    parser.add_argument("--evalplus-dir", default=None, help="EvalPlus data folder (default: $RPT_EVALPLUS_DIR, "
                                                              "else ../shared/data/evalplus)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (temperature > 0)")
    parser.add_argument("--isolation", default="auto", choices=ISOLATION_MODES)
    parser.add_argument("--fresh", action="store_true", help="forget stored generations and executions")
    add_chat_arg(group, CHAT_HELP + " (each benchmark's chat prompt: see eval/humaneval.py and eval/gsm8k.py --help)")
    return explain_defaults(parser, TABLE1)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:  # every flag, the checkpoint and its chat template before the first run: one line, nothing written
        table1.check_args(args)
        args.checkpoint = resolve_model_ref(args.checkpoint, "--checkpoint", "train one first (make demo) or check the path")
        if args.chat:
            require_chat_template(load_tokenizer(args.checkpoint), args.checkpoint, table1.chat_probes(args.benchmarks))
        trained = rpt_window_of(args.checkpoint) or 0
    except ValueError as e:  # ModelRefError, ConfigError and ChatTemplateError are ValueErrors
        return report_input_error(e, traceback_hint=False)
    windows = [w for w in args.windows if w <= trained or set(args.rpt_iters) <= {0}]
    skipped = sorted(set(args.windows) - set(windows))
    if skipped:
        print(f"note: windows {skipped} skipped: the checkpoint was trained with window {trained}", file=sys.stderr)
    if not windows:
        print("error: no window to run (see the note above)", file=sys.stderr)
        return 2
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    runs = table1.plan(windows, sorted(set(args.rpt_iters)), args.benchmarks)
    outputs = {}
    for step, job in enumerate(runs, start=1):
        argv_run = table1.argv_for(job, args)
        print(f"[table1] {step}/{len(runs)}: {job.benchmark}, w = {job.window}, k = {list(job.iters)}", flush=True)
        status = run(BENCHMARKS[job.benchmark](), argv_run)
        if status != 0:
            # the run printed its own error line: this one only says where the table stands
            print(f"note: stopped at the {job.benchmark} run (w = {job.window}); fix it and rerun: finished work is "
                  "kept", file=sys.stderr)
            return status
        outputs[job] = json.loads(job.out(folder).read_text())
    rows = table1.rows_from(outputs)
    notes = {"temperatures": args.temperatures, "confidence": args.confidence, "shots": args.shots,
             "limit": args.limit, "chat": args.chat, "skipped_windows": skipped}
    paths = table1.write_outputs(folder, args.checkpoint, rows, runs, notes)
    print(paths[1].read_text(encoding="utf-8"))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
