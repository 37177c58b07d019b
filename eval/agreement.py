"""Where RPT wins: the pre-registered agreement-pairs study (docs/agreement_preregistration.md).

    python eval/agreement.py                                   # the official run: seeds 0-4, source seed 0
    python eval/agreement.py --source-seed 1 --seeds 10 11 --steps 200   # development
    python eval/agreement.py --report docs/agreement.json      # re-render written results (no training)

Writes the agreement-pairs source (contents 0-15, tags 16-23, 64-token documents; exact joints in
closed form), trains three arms per training seed from scratch with ``configs/agreement.yaml``
(pure NTP; RPT w = 2, s = 1, q = 0.3; RPT q = 0.1), each run cached under ``--work`` (a rerun
resumes), scores every model exactly on 1000 tag-first and 1000 content-first windows (TV between
the true law of the next two tokens and the model's sampled law at k = 0 and k = 1), and writes the
predictions P1-P4 and the co-primary with their intervals, and the gap decomposed into RPT sampling and
RPT training (deciding nothing), to ``--out`` (.md/.png and the per-context TVs, .tvs.npz, beside it).
Every run trains with the keying of the objective's draws ``configs/agreement.yaml`` names, and records
it and the code's commit. ``--report`` re-renders written results with the decomposition, its context
intervals from a ``.tvs.npz`` beside the JSON only if that reproduces every recorded model's means.

The official seeds (training seeds 0-4 with source seed 0) are refused unless the pre-registration and
``configs/agreement.yaml`` hold what was registered, compared by content with the registration commit
(:mod:`rpt.studies.preregistration`: no uncommitted edit, hidden or not; the registered text unchanged;
the config's registered fields unchanged, keys added later recorded); the record goes into the results.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rpt.cli.parser import OneLineArgumentParser  # noqa: E402
from rpt.cli.study_command import refuse, run_study  # noqa: E402
from rpt.studies.agreement import results  # noqa: E402
from rpt.studies.agreement import run as runner  # noqa: E402


def build_parser() -> OneLineArgumentParser:
    parser = OneLineArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(runner.OFFICIAL_SEEDS), help="training seeds")
    parser.add_argument("--source-seed", type=int, default=None, help="the source's parameters (default 0, official)")
    parser.add_argument("--steps", type=int, default=None, help="override the config's max_steps (development)")
    parser.add_argument("--contexts", type=int, default=None, help="evaluation documents (development)")
    parser.add_argument("--train-docs", type=int, default=None, help="training documents (development)")
    parser.add_argument("--work", default=None, help="source and runs (default runs/agreement/source<seed>)")
    parser.add_argument("--out", default=None, help=f"output JSON (default {runner.OFFICIAL_OUT} for the official "
                        "run, <work>/agreement.json otherwise); .md/.png beside it")
    parser.add_argument("--parallel", type=int, default=2, help="training runs side by side, one thread each")
    parser.add_argument("--report", default=None, metavar="JSON", help="re-render these written results (and the "
                        "decomposition) instead of running the study")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.report is not None:
        return report(args.report)
    problem = runner.argument_problem(args)  # every argument, before any source is written or model trained
    if problem is None:
        try:
            design = runner.design_from_args(args)
        except ValueError as e:
            problem = str(e)
    if problem is not None:
        return refuse(problem)
    work = Path(args.work or f"runs/agreement/source{design.source_seed}").resolve()
    official = runner.is_official(design, args.seeds)
    out = args.out or (str(ROOT / runner.OFFICIAL_OUT) if official else str(work / "agreement.json"))

    def work_problem() -> str | None:
        if (work.exists() or work.is_symlink()) and not work.is_dir():
            return f"--work {work} is a file; name a directory for the source and the runs"
        return None

    return run_study(out, (".md", ".png", results.TVS_SUFFIX),
                     lambda: runner.run(design, args.seeds, work, steps=args.steps, parallel=args.parallel),
                     results.write_outputs, runner.Refused, check=work_problem)


def report(path: str) -> int:
    if not Path(path).is_file():
        return refuse(f"--report {path}: no such results file; give the JSON a run wrote (e.g. {runner.OFFICIAL_OUT})")
    try:
        paths = results.rereport(path)
    except KeyError as e:
        return refuse(f"--report {path}: not an agreement study's results (no {e}); give the JSON eval/agreement.py wrote")
    except ValueError as e:  # json.JSONDecodeError is one
        return refuse(f"--report {path}: {e}")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
