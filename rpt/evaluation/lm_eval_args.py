"""lm-eval ``--model_args`` for the ``rpt`` model, parsed strictly.

lm-eval hands each value over as it guessed it (``1`` an int, ``1.7`` a float, ``true`` a bool,
anything else a string). Each knob here takes exactly its type: an integer knob refuses ``1.7``
(never truncated to 1), a boolean one takes ``true`` / ``false`` only (``ture`` is an error, not
False), ``batch_size`` an integer >= 1 or ``auto`` (the default 8: there is no batch-size search),
``dtype`` one of :data:`DTYPES`; an unknown key is refused. Every error names the key.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from typing import Any

from rpt.cli.devices import DTYPES
from rpt.errors import ModelArgsError
from rpt.sampling.config import SamplingConfig

FIELDS = {f.name: f for f in dataclasses.fields(SamplingConfig)}
DEFAULT_BATCH_SIZE = 8
_INT = re.compile(r"^[+-]?\d+$")


def _bad(name: str, value: Any, want: str) -> ModelArgsError:
    return ModelArgsError(f"--model_args {name}={value!r} is invalid: use {want}")


def parse_int(name: str, value: Any, low: int | None = None) -> int:
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str) and _INT.match(value.strip()))):
        raise _bad(name, value, "an integer" + (f" >= {low}" if low is not None else ""))
    number = int(value)
    if low is not None and number < low:
        raise _bad(name, value, f"an integer >= {low}")
    return number


def parse_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise _bad(name, value, "true or false")


def parse_float(name: str, value: Any) -> float:
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number):
        raise _bad(name, value, "a finite number")
    return number


def sampling_value(name: str, value: Any) -> Any:
    """``model_args`` value ``value`` as the type of SamplingConfig field ``name``."""
    if name == "stop":
        return [s for s in value.split("|") if s] if isinstance(value, str) else list(value)
    if name == "eos_token_id":
        return None if value in (None, "None", "") else parse_int(name, value, low=0)
    if name == "seed":
        return None if value in (None, "None", "") else parse_int(name, value)
    hint = typing.get_type_hints(SamplingConfig)[name]
    if hint is bool:
        return parse_bool(name, value)
    if hint is int:
        return parse_int(name, value)
    if hint is float:
        return parse_float(name, value)
    return value


def sampling_knobs(sampling: dict[str, Any]) -> dict[str, Any]:
    """The SamplingConfig fields of ``model_args``, typed; an unknown key is an error."""
    unknown = sorted(set(sampling) - set(FIELDS))
    if unknown:
        raise ModelArgsError(f"model_args {', '.join(unknown)} are not SamplingConfig fields "
                             f"(known: pretrained, device, dtype, batch_size, max_length, {', '.join(FIELDS)})")
    return {name: sampling_value(name, value) for name, value in sampling.items()}


def batch_size_of(value: Any) -> int:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return DEFAULT_BATCH_SIZE
    return parse_int("batch_size", value, low=1)


def dtype_of(value: Any) -> str:
    if value not in DTYPES:
        raise _bad("dtype", value, " | ".join(DTYPES))
    return value


def max_length_of(value: Any) -> int | None:
    return None if value in (None, "None", "") else parse_int("max_length", value, low=2)
