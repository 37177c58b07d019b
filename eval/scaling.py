"""At what scale should RPT help on code? The pre-registered scaling study (docs/scaling_preregistration.md).

    python eval/scaling.py                                  # the official run: seeds 0 1, configs/scaling.yaml
    nohup python eval/scaling.py > /tmp/scaling.log 2>&1 &  # in the background; a rerun resumes
    python eval/scaling.py --seeds 100 --work runs/scaling_pilot   # development (a pilot)

Five sizes of the demo's Llama family (about 69K to 2.1M parameters, the demo's 4096-token BPE on
the Python standard library), each pretrained with NTP and fine-tuned with RPT at the demo's w = 2,
s = 0.5, q = 0.15, at one training token per parameter, two seeds each; every model measured on the
same validation positions: NTP and PTP-1 loss, the PTP excess (PTP head loss minus the loss of the PTP
its own NTP head implies), eps before and after one RPT iteration and the share of positions it
improves (greedy PTP at confidence 0.9 and 0, sampled PTP at 0). Fits against parameter count, the
crossover where eps_1 - eps_0 turns negative with a bootstrap interval over seeds and positions, and
the registered predictions, held or failed, go to ``--out`` (.md/.png beside it).

Each training run is cached under ``--work`` and each measured model in ``<work>/measured``, so an
interrupted run resumes where it stopped. The official seeds are refused unless the pre-registration
and the configs are, byte for byte, in a commit of this branch that precedes any committed official
result; the registration commits and the code's commit are recorded in the results.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rpt.cli.study_command import refuse, run_study  # noqa: E402
from rpt.studies.scaling import run as runner  # noqa: E402
from rpt.studies.scaling.design import CONFIG, Design  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="training seeds (default: the official ones)")
    parser.add_argument("--sizes", type=int, default=None, help="only the first N sizes, each trained as in the whole "
                        "design (development)")
    parser.add_argument("--tokens-per-parameter", type=float, default=None, help="development")
    parser.add_argument("--positions", type=int, default=None, help="error-analysis positions (development)")
    parser.add_argument("--excess-positions", type=int, default=None, help="PTP-excess positions (development)")
    parser.add_argument("--work", default=None, help=f"runs and measurements (default {runner.DEFAULT_WORK} for the "
                        "official seeds, runs/scaling_dev otherwise)")
    parser.add_argument("--out", default=None, help=f"output JSON (default {runner.OFFICIAL_OUT} for the official run, "
                        "<work>/scaling.json otherwise); .md/.png beside it")
    parser.add_argument("--parallel", type=int, default=2, help="training runs and measurements side by side, one "
                        "thread each")
    return parser


def design_from_args(args: argparse.Namespace) -> tuple[Design, bool]:
    design = Design.load(ROOT / CONFIG)
    changes = {k: v for k, v in (("tokens_per_parameter", args.tokens_per_parameter), ("positions", args.positions),
                                 ("excess_positions", args.excess_positions)) if v is not None}
    if args.sizes is not None and not 2 <= args.sizes <= len(design.sizes):
        raise ValueError(f"--sizes {args.sizes}: give 2 to {len(design.sizes)}")
    return dataclasses.replace(design, **changes), bool(changes)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        design, changed = design_from_args(args)
        design.check()
    except (ValueError, OSError) as e:
        return refuse(str(e))
    seeds = args.seeds if args.seeds is not None else list(design.seeds)
    official = runner.is_official(design, seeds)
    work = Path(args.work or (runner.DEFAULT_WORK if official else "runs/scaling_dev")).resolve()
    out = args.out or (str(ROOT / runner.OFFICIAL_OUT) if official else str(work / "scaling.json"))
    return run_study(out, (".md", ".png"),
                     lambda: runner.run(design, seeds, work, parallel=max(1, args.parallel), changed=changed,
                                        sizes=args.sizes, measure_threads=1 if args.parallel > 1 else None),
                     runner.write_outputs, runner.Refused)


if __name__ == "__main__":
    sys.exit(main())
