"""lm-evaluation-harness with the ``rpt`` model registered: lm-eval's own command line.

    python eval/lm_eval.py --model rpt --model_args pretrained=runs/demo/rpt/final,rpt_iters=1 \\
        --tasks gsm8k_local --include_path eval/lm_eval_tasks --limit 4 --output_path runs/lm_eval

Every lm-eval flag applies; ``--model rpt`` takes ``pretrained`` plus every SamplingConfig knob
through ``--model_args`` (see ``rpt/evaluation/lm_eval_adapter.py``). ``gsm8k_local``
(``eval/lm_eval_tasks/gsm8k_local.yaml``) reads ``../shared/data/gsm8k`` relative to the directory
it runs in, so it runs offline. Needs the ``lm-eval`` extra (``pip install -e '.[lm-eval]'``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# This file is named like the package it drives: drop its folder from the import path, or
# ``import lm_eval`` would import this script.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local tasks only: never reach for the hub
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from lm_eval.__main__ import cli_evaluate

        import rpt.evaluation.lm_eval_adapter  # noqa: F401  (registers the "rpt" model)
    except ImportError as exc:
        print(f"error: lm-eval is not installed ({exc}); pip install -e '.[lm-eval]'", file=sys.stderr)
        return 2
    from rpt.cli.parser import report_input_error

    sys.argv = [sys.argv[0], *(sys.argv[1:] if argv is None else argv)]
    try:
        cli_evaluate()
    except (ValueError, FileNotFoundError, KeyError) as e:  # ours (model_args, checkpoint) and lm-eval's (tasks, flags)
        return report_input_error(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
