"""The device and the weights' dtype a command runs with: ``--device`` checked against this machine
before anything is loaded (``train.py``, ``sample.py``, the evaluation scripts, the lm-eval model), and
``--dtype`` from the one list every entry point offers.

torch is imported where a device is checked or a dtype resolved, not at import: ``--help`` of the
entry points that list :data:`DTYPE_CHOICES` stays free of it.
"""

from __future__ import annotations

_DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu")

DTYPES = ("float32", "bfloat16", "float16")  # the weights' dtypes a model is loaded in
DTYPE_CHOICES = ("auto", *DTYPES)  # --dtype: auto is bfloat16 on CUDA, float32 elsewhere


def auto_device() -> str:
    """cuda when this machine has it, else cpu."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(name: str, device: str):
    """The ``torch.dtype`` of ``name``: ``auto`` is bfloat16 on CUDA, float32 elsewhere."""
    import torch

    if name == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    if name not in DTYPE_CHOICES:
        raise ValueError(f"--dtype {name} is not one of {', '.join(DTYPE_CHOICES)}")
    return getattr(torch, name)


def check_device(name: str, flag: str = "--device") -> str:
    """``name`` as a device this machine has (checked before anything is loaded): a string torch
    does not read, a kind of device no model runs on (``meta`` holds no values), or an absent
    accelerator is one ``ValueError`` naming ``flag``."""
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"{flag} {name!r} is not a device; use cpu, cuda, cuda:N or mps") from None
    if device.type not in _DEVICE_TYPES:
        raise ValueError(f"{flag} {name!r} is not a device to run a model on; use one of {', '.join(_DEVICE_TYPES)}")
    if device.type == "cpu":
        return name
    backend = getattr(torch, device.type, None) if device.type != "mps" else torch.backends.mps
    if backend is None or not backend.is_available():
        cpu = f"{flag} cpu" if flag.startswith("--") else f"{flag}=cpu"
        raise ValueError(f"{flag} {name!r} asks for {device.type}, but this machine has no {device.type} device visible; "
                         f"use {cpu}")
    count = backend.device_count() if hasattr(backend, "device_count") else 1
    if device.index is not None and device.index >= count:
        raise ValueError(f"{flag} {name!r} names {device.type} device {device.index}, but {count} are visible; use an "
                         f"index below {count}")
    return name
