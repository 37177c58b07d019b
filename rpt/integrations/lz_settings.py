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
# LZ with RPT: the RPT engine's step (rpt.integrations.vllm_rpt) does not apply the penalty yet
_WITH_RPT = ("lz_penalty together with rpt_iters is not served yet: the engine's RPT step does not apply the LZ "
             "penalty; drop one of them, or decode with rpt.sampling.generate")


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
        if extra.get("rpt_iters") and extra.get("lz_penalty"):
            raise ValueError(f"extra_args rpt_iters={extra['rpt_iters']!r}: {_WITH_RPT}")
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
