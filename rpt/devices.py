"""The devices a run may name: ``train.py``, ``sample.py``, the evaluation scripts and the lm-eval model
check a ``--device`` before anything is loaded, with one message."""

from __future__ import annotations

import torch

_DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu")


def check_device(name: str, flag: str = "--device") -> str:
    """``name`` as a device this machine has (checked before anything is loaded): a string torch
    does not read, a kind of device no model runs on (``meta`` holds no values), or an absent
    accelerator is one ``ValueError`` naming ``flag``."""
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
