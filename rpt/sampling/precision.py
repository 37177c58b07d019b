"""The weights' dtype of a run: ``--dtype auto|float32|bfloat16|float16`` in every entry point."""

from __future__ import annotations

import torch

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


def resolve_dtype(name: str, device: str) -> torch.dtype:
    """``auto``: bfloat16 on CUDA, float32 elsewhere; otherwise the named dtype."""
    if name == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    if name not in DTYPE_CHOICES:
        raise ValueError(f"--dtype {name} is not one of {', '.join(DTYPE_CHOICES)}")
    return getattr(torch, name)
