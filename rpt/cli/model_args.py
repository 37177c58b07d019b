"""The model flags, defined once for every command that loads a checkpoint to sample from (``sample.py``,
the benchmark scripts, ``eval/table1.py``, ``eval/repetition.py``): ``--checkpoint``, ``--device``,
``--dtype``, ``--batch-size``, ``--compile``.

Their defaults that differ between entry points (``--dtype``, ``--device``) are the caller's, each stated
with its reason in :data:`rpt.sampling.entry_defaults.DIFFERENCES`.
"""

from __future__ import annotations

import argparse

from rpt.cli.devices import DTYPE_CHOICES, auto_device
from rpt.sampling.flags import add_compile_arg

CHECKPOINT_HELP = "RPT checkpoint directory (or a plain HF causal LM for --rpt-iters 0)"


def add_model_args(parser: argparse.ArgumentParser, *, required: bool = True, dtype: str = "float32",
                   device_after_parsing: bool = False) -> argparse._ArgumentGroup:
    """The model flags in a group of their own (returned, for a caller's further model flags).

    ``required=False``: ``--checkpoint`` is optional (scripts that can also score given completions);
    ``dtype``: ``--dtype``'s default; ``device_after_parsing``: ``--device`` defaults to None, the command
    deciding after parsing (``sample.py``: the process's device under ``accelerate launch``), else to cuda
    where this machine has it, else cpu."""
    group = parser.add_argument_group("model")
    group.add_argument("--checkpoint", required=required, help=CHECKPOINT_HELP)
    group.add_argument("--device", default=None if device_after_parsing else auto_device(),
                       help="cpu, cuda, cuda:1, ... (default: cuda if available, else cpu)")
    group.add_argument("--dtype", default=dtype, choices=DTYPE_CHOICES,
                       help="weights dtype (default: %(default)s; auto: bfloat16 on CUDA, float32 on CPU)")
    group.add_argument("--batch-size", type=int, default=8, help="prompts decoded together")
    add_compile_arg(group)
    return group
