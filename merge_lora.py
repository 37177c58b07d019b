#!/usr/bin/env python
"""Merge a LoRA checkpoint (train.py with a ``lora:`` section) into a full faithful RPT checkpoint.

    python merge_lora.py runs/lora/final runs/lora/merged

The output is what a full fine-tune writes (``rpt/checkpoint/folded_weights.py``: plain ``AutoModelForCausalLM``
computes the RPT model's NTP logits; ``custom_generate/`` included), written atomically.
"""

import argparse
import sys

from rpt.cli.output_paths import check_output
from rpt.cli.parser import report_input_error


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("adapter", help="the LoRA checkpoint directory (e.g. runs/lora/final)")
    ap.add_argument("out", help="where to write the merged checkpoint (replaced if it exists)")
    args = ap.parse_args(argv)
    from rpt.checkpoint.model_ref import resolve_model_ref
    from rpt.model.lora import merge

    try:
        adapter = resolve_model_ref(args.adapter, "the adapter", "give the final/ directory of a run with a lora: section")
        check_output(args.out, "the output", directory=True)
        print(f"wrote {merge(adapter, args.out)}")
    except (ValueError, OSError, ImportError) as e:
        return report_input_error(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
