#!/usr/bin/env python
"""Train or fine-tune a causal LM with the RPT (or plain NTP) objective.

    python train.py --config configs/tiny.yaml [key=value ...]
    accelerate launch --config_file configs/accelerate/deepspeed_zero3.yaml train.py --config configs/llama3_8b_rpt.yaml
"""

import argparse
import sys

from rpt.config import ConfigError, load_config, report_input_error
from rpt.data import DataError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="YAML config (see configs/)")
    ap.add_argument("overrides", nargs="*", help="key=value overrides, e.g. max_steps=100 lr=3e-4")
    args = ap.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from rpt.training import run

    try:
        run(cfg)
    except (DataError, ValueError, FileNotFoundError) as e:
        return report_input_error(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
