#!/usr/bin/env python
"""Train or fine-tune a causal LM with the RPT (or plain NTP) objective.

    python train.py --config configs/tiny.yaml [key=value ...]
    accelerate launch --config_file configs/accelerate/deepspeed_zero3.yaml train.py --config configs/llama3_8b_rpt.yaml

Before any work the run's output paths, tracker package and model references (local directory or
hub id, cached or reachable) are checked; a problem is one ``error: ...`` line and exit status 2.
A start-up block names the model, parameters, device, precision, world size, tokens per step, data
and where the run starts (also in ``<output_dir>/run_summary.txt``); ``<output_dir>/train.log``
holds one plain line per logged step.
"""

import argparse
import os
import sys

from rpt.cli.parser import OneLineArgumentParser, report_input_error
from rpt.training.config import ConfigError, load_config


def main(argv: list[str] | None = None) -> int:
    ap = OneLineArgumentParser(prog=os.path.basename(__file__), description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="YAML config (see configs/)")
    ap.add_argument("overrides", nargs="*", help="key=value overrides, e.g. max_steps=100 lr=3e-4")
    ap.add_argument("--device", help="the device of a one-process run: cpu, cuda, cuda:N, mps (default: accelerate's "
                                     "choice; under accelerate launch each process takes its own)")
    ap.add_argument("--break-lock", action="store_true",
                    help="take output_dir's run.lock even if another trainer seems to hold it (one trainer per "
                         "output_dir; a dead trainer's lock is taken over by itself once stale)")
    args = ap.parse_args(argv)
    if args.break_lock:
        os.environ["RPT_BREAK_RUN_LOCK"] = "1"  # rpt.training.run_dir.lock reads it (every rank gets the same argv)
    if args.device:
        os.environ["ACCELERATE_TORCH_DEVICE"] = args.device  # the device accelerate's state takes
    from rpt.training.preflight import check_train_device, check_train_inputs

    try:
        cfg = load_config(args.config, args.overrides)
        check_train_inputs(cfg)
        check_train_device("--device" if args.device else "ACCELERATE_TORCH_DEVICE")
    except ConfigError as e:
        return report_input_error(e, traceback_hint=False)
    from rpt.data import DataError
    from rpt.training.loop import run
    from rpt.training.run_dir.lock import release_run_lock

    try:
        run(cfg)
    except (DataError, ValueError, OSError) as e:  # OSError: a file that cannot be read or written, named by it
        return report_input_error(e)
    finally:
        release_run_lock(cfg.output_dir)
    return 0

if __name__ == "__main__":
    sys.exit(main())
