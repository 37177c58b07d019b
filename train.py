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
import sys

from rpt.config import ConfigError, load_config, report_input_error


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="YAML config (see configs/)")
    ap.add_argument("overrides", nargs="*", help="key=value overrides, e.g. max_steps=100 lr=3e-4")
    args = ap.parse_args(argv)
    from rpt.preflight import check_train_inputs

    try:
        cfg = load_config(args.config, args.overrides)
        check_train_inputs(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from rpt.data import DataError
    from rpt.training import run

    try:
        run(cfg)
    except (DataError, ValueError, FileNotFoundError) as e:
        return report_input_error(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
