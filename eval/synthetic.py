"""The RPT paper's synthetic NTP-vs-RPT experiment (Sec. 3, Fig. 4; App. A.3 noise levels).

    python eval/synthetic.py --trials 1000 --seed 0 --out runs/eval/synthetic.json

Writes ``F.json`` (``cases`` at eps_n = 1, ``noise_levels`` at eps_n = 0.1 and 0.01), a markdown
table ``F.md``, Fig. 4-style histograms ``F.png`` (eps_n = 1) and ``F.eps_n_<eps>.png``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from rpt.cli.output_paths import output_problem
from rpt.cli.parser import report_input_error
from rpt.errors import InputError
from rpt.result_files import save_figure, sibling, write_json, write_markdown
from rpt.studies.sec3 import synthetic as syn

DEFAULT_OUT = "runs/eval/synthetic.json"
COLUMNS = ("name", "eps_n", "eps_p", "tv_ntp_mean", "tv_rpt_mean", "max_ntp_mean", "max_rpt_mean",
           "frac_rpt_better")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=1000, help="independent random ground truths")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab", type=int, default=syn.VOCAB, help="vocabulary size V")
    parser.add_argument("--out", default=DEFAULT_OUT, help="output JSON; .md/.png go beside it")
    return parser


def run(trials: int, seed: int, vocab: int) -> dict[float, list[syn.CaseResult]]:
    """All cases at every noise level, sharing one batch of draws."""
    draws = syn.draw(trials, vocab=vocab, seed=seed)
    levels = (syn.MAIN_EPS_N, *syn.APPENDIX_EPS_N)
    return {eps_n: syn.run_noise_level(draws, eps_n) for eps_n in tqdm(levels, desc="synthetic", unit="eps_n")}


def write_outputs(out: str | Path, args: argparse.Namespace, by_level: dict[float, list[syn.CaseResult]]) -> list[Path]:
    summary = {
        "experiment": "synthetic",
        "vocab": args.vocab,
        "trials": args.trials,
        "seed": args.seed,
        "cases": [r.summary() for r in by_level[syn.MAIN_EPS_N]],
        "noise_levels": [r.summary() for eps in syn.APPENDIX_EPS_N for r in by_level[eps]],
    }
    rows = [[case[c] for c in COLUMNS] for case in summary["cases"] + summary["noise_levels"]]
    notes = (f"V = {args.vocab}, {args.trials} trials, seed {args.seed}. Errors of the sampled joint against "
             "the ground truth; `frac_rpt_better`: fraction of trials where RPT's TV error is below NTP's.")
    paths = [
        write_json(out, summary),
        write_markdown(sibling(out, ".md"), "Synthetic NTP vs RPT (RPT paper Fig. 4)", [(COLUMNS, rows)], notes),
    ]
    for eps_n, results in by_level.items():
        suffix = ".png" if eps_n == syn.MAIN_EPS_N else f".eps_n_{eps_n:g}.png"
        fig = syn.plot_histograms(results, f"NTP vs RPT sampling errors, V = {args.vocab}, {args.trials} trials")
        paths.append(save_figure(fig, sibling(out, suffix)))
    return paths


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # each of the run's arrays holds trials x V x V float64 numbers: 2^26 of them is 512 MB
    problem = output_problem(args.out, "--out", siblings=(".md", ".png")) or (
        None if args.trials >= 1 and args.vocab >= 2 and args.trials * args.vocab**2 <= 2**26 else
        "need --trials >= 1, --vocab >= 2 and --trials x --vocab^2 <= 2^26 (each array is trials x V x V floats)")
    if problem is not None:
        return report_input_error(InputError(problem), traceback_hint=False)
    by_level = run(args.trials, args.seed, args.vocab)
    paths = write_outputs(args.out, args, by_level)
    print(open(paths[1], encoding="utf-8").read())
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
