"""A serving request's LZ settings, read from ``SamplingParams.extra_args`` (no vLLM import).

The keys are :class:`~rpt.sampling.config.SamplingConfig`'s names: ``lz_penalty`` (alpha; absent or 0:
the request is untouched), ``lz_window``, ``lz_buffer``, ``lz_variant``, ``lz_include_prompt``, with
its defaults and its validation, so a setting means what it means in ``sample.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rpt.sampling.config import SamplingConfig

KEYS = ("lz_penalty", "lz_window", "lz_buffer", "lz_variant", "lz_include_prompt")
# Per-request bounds, checked at admission: what one LZ request may cost the engine. A row's state is
# 16 * W bytes (128 KiB at the bound), its setting's penalty table 4 * (B + 1) * W bytes (4.2 MB), and
# Model Runner V2's per-step match lengths B * W bytes per row (1 MiB). The paper's W is 512, B 32.
MAX_WINDOW = 8192
MAX_BUFFER = 128
# SamplingConfig knobs an engine's plain NTP step cannot honour: refused rather than ignored
_NOT_SERVED = {
    "rpt_iters": "RPT iterations need the checkpoint's offset table and previous-token queries, which a serving "
                 "engine does not run; decode with rpt.sampling.generate or sample.py",
}


@dataclass(frozen=True)
class LZSettings:
    alpha: float
    window: int
    buffer: int
    variant: str
    include_prompt: bool

    @classmethod
    def from_extra_args(cls, extra_args: dict[str, Any] | None) -> LZSettings | None:
        """The request's settings, ``None`` when it asks for no LZ penalty; ``ValueError`` naming the
        bad key and the fix otherwise."""
        extra = extra_args or {}
        for key, why in _NOT_SERVED.items():
            if extra.get(key):
                raise ValueError(f"extra_args[{key!r}]={extra[key]!r} is not available in the engine: {why}")
        asked = {k: v for k, v in extra.items() if isinstance(k, str) and k.startswith("lz_")}
        unknown = sorted(set(asked) - set(KEYS))
        if unknown:
            raise ValueError(f"extra_args {unknown} are not LZ penalty settings: use {', '.join(KEYS)} "
                             "(rpt.integrations.vllm)")
        if not asked:
            return None
        if "lz_penalty" not in asked:
            raise ValueError(f"extra_args {sorted(asked)} without 'lz_penalty': add lz_penalty=alpha (e.g. 0.15) "
                             "to turn the LZ penalty on")
        flag = asked.get("lz_include_prompt")
        # vLLM's HTTP API types extra_args values as str | int | float: a JSON true arrives as 1
        if isinstance(flag, str) and flag.lower() in ("true", "false"):
            asked["lz_include_prompt"] = flag.lower() == "true"
        elif type(flag) is int and flag in (0, 1):
            asked["lz_include_prompt"] = bool(flag)
        try:
            config = SamplingConfig(**asked)
        except ValueError as e:  # SamplingConfig's message names the field and the fix
            raise ValueError(f"extra_args {str(e).removeprefix('SamplingConfig.')} (the LZ penalty, "
                             "rpt.integrations.vllm)") from None
        for key, value, bound in (("lz_window", config.lz_window, MAX_WINDOW), ("lz_buffer", config.lz_buffer, MAX_BUFFER)):
            if value > bound:
                raise ValueError(f"extra_args {key}={value} is above the engine's bound {bound} (per-request memory: "
                                 "rpt.integrations.lz_settings); use at most that (the paper: lz_window 512, lz_buffer 32)")
        if config.lz_penalty == 0:
            return None
        return cls(config.lz_penalty, config.lz_window, config.lz_buffer, config.lz_variant, config.lz_include_prompt)
