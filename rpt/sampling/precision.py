"""The weights' dtype of a run: ``--dtype auto|float32|bfloat16|float16`` in every entry point.

No torch import at module level: ``--help`` of the entry points that list :data:`DTYPE_CHOICES`
stays free of it.
"""

from __future__ import annotations

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


def resolve_dtype(name: str, device: str):
    """The ``torch.dtype`` of ``name``: ``auto`` is bfloat16 on CUDA, float32 elsewhere."""
    import torch

    if name == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    if name not in DTYPE_CHOICES:
        raise ValueError(f"--dtype {name} is not one of {', '.join(DTYPE_CHOICES)}")
    return getattr(torch, name)
