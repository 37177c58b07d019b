"""The controlled experiment: RPT vs NTP sampling against a known truth (docs/controlled_experiment.md).

    python eval/controlled.py --out runs/controlled/controlled.json [--seeds 0 1]
    python eval/controlled.py --source runs/controlled/source --checkpoints A/final B/final --out F.json

    python eval/controlled.py --sweep [--qs 0.05 0.1 0.3 0.6 1.0] [--seeds 0 1] [--out docs/theory_test.json]

The sweep (docs/theory_test_preregistration.md) trains from scratch with the RPT
objective (``configs/controlled_sweep.yaml``), one arm per q plus a pure-NTP arm, per seed, under
``--work``; it writes the crossovers, per-model r / TV_0 / TV_1 / signs, pooled intervals, Spearman
and the practical test to ``--out`` (.md/.png beside it).

The first form does everything, each step cached under the directory of ``--out``: writes the source
(a fixed hidden Markov model over 16 symbols, its samples as JSONL, a one-symbol-per-token
tokenizer), trains per seed with ``train.py`` (``configs/controlled_pretrain.yaml``: NTP, then
``configs/controlled_finetune.yaml``: the RPT fine-tune, w = 2), and evaluates. The second form only
evaluates existing RPT checkpoints trained on ``--source``.

Evaluation: for contexts drawn from the source, the exact law of the next w tokens the model samples
with NTP (k = 0) and after k RPT iterations (eq. 4, sampled PTP), its total variation to the true
joint (forward algorithm), bootstrap 95% intervals over contexts (paired across k and seeds), the
learned model's Sec. 3 errors (eps_p / eps_n) and the Sec. 3 noise-model prediction for the source.
Writes ``F.json``, ``F.md`` and ``F.png``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rpt.studies.controlled.run import DEFAULT_OUT, FINETUNE_CONFIG, SWEEP_QS, run_controlled  # noqa: E402
from rpt.studies.controlled.source import Design  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=DEFAULT_OUT, help="output JSON; .md/.png beside it, runs in its directory")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="training seeds")
    parser.add_argument("--pretrain-steps", type=int, default=None, help="override the pretrain config's max_steps")
    parser.add_argument("--finetune-steps", type=int, default=None, help="override the fine-tune config's max_steps")
    parser.add_argument("--finetune-config", default=FINETUNE_CONFIG,
                        help="the RPT fine-tune's config (default %(default)s; the follow-up: "
                             "configs/controlled_finetune_ptp_rich.yaml)")
    parser.add_argument("--contexts", type=int, default=Design.contexts, help="evaluation contexts")
    parser.add_argument("--source", default=None, help="an existing source directory (with --checkpoints)")
    parser.add_argument("--checkpoints", nargs="+", default=None, help="evaluate these RPT checkpoints only")
    parser.add_argument("--compare", nargs="*", default=[], metavar="LABEL=F.json",
                        help="draw these earlier results' measured points on the plot too")
    parser.add_argument("--parallel", type=int, default=2, help="training runs side by side (default %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads for the evaluation")
    parser.add_argument("--sweep", action="store_true", help="the pre-registered theory-test sweep (docs/theory_test_preregistration.md) instead")
    parser.add_argument("--qs", type=float, nargs="+", default=list(SWEEP_QS), help="sweep arms (q of the RPT objective)")
    parser.add_argument("--no-ntp-arm", action="store_true", help="sweep without the pure-NTP arm")
    parser.add_argument("--sweep-steps", type=int, default=None, help="override the sweep config's max_steps")
    parser.add_argument("--work", default="runs/controlled", help="the sweep's source and runs (default %(default)s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_controlled(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
