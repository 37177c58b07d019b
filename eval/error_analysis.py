"""The RPT paper's error analysis (Sec. 5.3): Table 2 (eps_k by RPT iteration) and Fig. 6.

    python eval/error_analysis.py --checkpoint runs/t1/final --limit 1000 --out runs/eval/error_analysis.json
    python eval/error_analysis.py --checkpoint DIR --text-file valid.txt --exact --out F.json

At positions of the validation text with at least ``--min-context`` tokens of context (at most
``--context-len`` of them are fed), ``eps_k = 1 - p_k(x_i | x_<i)`` after k = 0..iters
iterations of the w = 2 RPT chain started from NTP (see :mod:`rpt.studies.error_analysis.analysis`).
Text: ``--data F.jsonl`` (a ``text`` field per line), ``--text-file F`` (one document), or by
default the validation split of the Python standard library. Each document is tokenised without
special tokens and preceded by EOS, as in the training stream. ``--top-m M`` (default 16) is
the truncated estimator, with a certified per-position error bound (``tv_error_bound_by_iters``,
the mean bound, is loose); ``--exact`` enumerates the vocabulary (small vocabularies: about 0.4
positions/s at V = 4096 on 2 CPU cores, against about 65 for ``--top-m 16``).

Writes ``F.json`` (``tv_by_iters`` with ``tv_ci_by_iters``, ``tv_change_1_0`` (eps_1 - eps_0)
with its interval, the estimator's bound and a verdict, ``frac_improved`` with its interval,
``n_positions``, ``estimator``, ``histogram``, ...; intervals: 95% bootstrap over positions), ``F.md`` and ``F.png`` (the Fig. 6 histogram of ``p_1 - p_0``); finished
positions are kept in ``F.items.jsonl`` so a rerun on the same ``--out`` skips them.
"""

from __future__ import annotations

import argparse
import sys

import torch

from rpt.cli.devices import check_device
from rpt.cli.output_paths import REPORT_SIBLINGS, output_problem
from rpt.cli.parser import OneLineArgumentParser, report_input_error
from rpt.evaluation.user_jsonl import EvalInputError
from rpt.studies.error_analysis.run import run_error_analysis

DEFAULT_OUT = "runs/eval/error_analysis.json"
DEFAULT_TOP_M = 16


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="RPT checkpoint directory (with its tokenizer)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--data", default=None, help="JSONL file with a 'text' field per line")
    source.add_argument("--text-file", default=None, help="a plain text file, read as one document")
    parser.add_argument("--val-fraction", type=float, default=0.05, help="stdlib validation share (default data)")
    parser.add_argument("--limit", type=int, default=1000, help="number of positions (0: all of them)")
    parser.add_argument("--min-context", type=int, default=20, help="tokens of context a position needs")
    parser.add_argument("--context-len", type=int, default=128, help="at most this many context tokens are fed")
    est = parser.add_mutually_exclusive_group()
    est.add_argument("--top-m", type=int, default=DEFAULT_TOP_M, help="top-m estimator (default %(default)s)")
    est.add_argument("--exact", action="store_true", help="enumerate the whole vocabulary")
    parser.add_argument("--iters", type=int, default=3, help="RPT iterations k = 0..iters")
    parser.add_argument("--ptp", choices=("sampled", "greedy"), default="sampled",
                        help="PTP step: draw from the PTP conditional (eq. 4 as written, default) or take its "
                             "argmax (the paper's main results and the sampler's default)")
    parser.add_argument("--confidence", type=float, default=0.0,
                        help="keep x_i unless the PTP proposal's probability exceeds this (the sampler's eta; "
                             "the paper uses 0.9 with --ptp greedy; default %(default)s)")
    parser.add_argument("--precondition", type=int, default=0, metavar="N",
                        help="also compare the PTP head's loss with the NTP-implied P*'s on N positions (exact: "
                             "V NTP queries each; default %(default)s = skip)")
    parser.add_argument("--batch-size", type=int, default=16, help="positions per forward")
    parser.add_argument("--seed", type=int, default=0, help="position sampling seed")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--fresh", action="store_true", help="ignore finished positions of an earlier run")
    parser.add_argument("--out", default=DEFAULT_OUT, help="output JSON; .md/.png go beside it")
    return parser


def check_args(args: argparse.Namespace) -> None:
    if not 0.0 <= args.confidence <= 1.0:
        raise EvalInputError(f"--confidence {args.confidence}: use a probability in [0, 1] (the paper's eta is 0.9)")
    if args.min_context < 1 or args.context_len < args.min_context:
        raise EvalInputError("need 1 <= --min-context <= --context-len")
    if args.precondition < 0:
        raise EvalInputError("--precondition N: use N >= 0 positions")
    if args.limit < 0 or args.iters < 1 or args.batch_size < 1 or (not args.exact and args.top_m < 1):
        raise EvalInputError("need --limit >= 0, --iters >= 1, --batch-size >= 1 and --top-m >= 1")
    if not 0.0 < args.val_fraction < 1.0:
        raise EvalInputError("--val-fraction must be in (0, 1)")
    problem = output_problem(args.out, "--out", siblings=REPORT_SIBLINGS)
    if problem is not None:  # before the model loads: a bad --out would fail only after the analysis
        raise EvalInputError(problem)
    check_device(args.device)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_args(args)
    except ValueError as exc:
        return report_input_error(exc, traceback_hint=False)
    return run_error_analysis(args)


if __name__ == "__main__":
    sys.exit(main())
