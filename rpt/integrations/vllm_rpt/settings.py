"""A serving request's RPT settings, read from ``SamplingParams.extra_args`` and the request's own
sampling fields (no vLLM import: a params object is read by attribute names).

``extra_args`` takes :class:`~rpt.sampling.config.SamplingConfig`'s names: ``rpt_iters`` (k; absent
or 0: a plain request, untouched), ``rpt_window`` (w, at most the checkpoint's trained window),
``confidence`` (eta), ``ptp_greedy``, ``penalize_ptp``. Temperature, top-k, top-p, min-p and the
seed come from the request's own fields and mean what they mean in :func:`rpt.sampling.generate`
(a seeded request draws with the row seed ``row_seed(seed, 0)``: the tokens of ``generate`` on that
prompt alone with that seed). What the engine path does not run yet is refused, one line each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from rpt.checkpoint.rpt_config import check_window_covers
from rpt.errors import RPTSettingError
from rpt.sampling.config import SamplingConfig
from rpt.sampling.randomness import row_seed

KEYS = ("rpt_iters", "rpt_window", "confidence", "ptp_greedy", "penalize_ptp")
# Each iteration can cost the request one engine step per token; a typo like 10**9 would pin it forever.
MAX_ITERS = 16
_EPS = 1e-5  # vLLM treats a temperature below this as greedy


@dataclass(frozen=True)
class RPTSettings:
    config: SamplingConfig  # k, w, eta and the sampling knobs, validated
    row_seed: int  # keys every draw of the request (rpt.sampling.randomness)

    @property
    def window(self) -> int:
        return self.config.rpt_window


def _flag(value: Any, key: str) -> bool:
    # vLLM's HTTP API types extra_args values as str | int | float: a JSON true may arrive as 1 or "true"
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if type(value) is int and value in (0, 1):
        return bool(value)
    raise RPTSettingError(f"extra_args {key}={value!r} is invalid: use true or false")


def asks_for_rpt(extra_args: dict[str, Any] | None) -> bool:
    """Whether the request names any RPT setting (then it is validated as an RPT request)."""
    return any(k in (extra_args or {}) for k in KEYS)


def refusals(params) -> list[str]:
    """What an RPT request asks for that the engine path does not run, one line each."""
    out = []
    extra = getattr(params, "extra_args", None) or {}
    if extra.get("lz_penalty"):
        out.append("lz_penalty together with rpt_iters is not served yet: drop one, or decode with rpt.sampling.generate")
    if getattr(params, "logprobs", None) is not None or getattr(params, "prompt_logprobs", None) is not None:
        out.append("logprobs are not returned for RPT requests yet (a token's logits change with corrections): drop logprobs")
    if getattr(params, "structured_outputs", None) is not None:
        out.append("structured output cannot constrain RPT's corrections yet: drop it, or drop rpt_iters")
    if getattr(params, "stop", None):
        out.append("stop strings are not applied to RPT requests yet: use stop_token_ids, or cut the text afterwards")
    if getattr(params, "min_tokens", 0):
        out.append("min_tokens is not applied to RPT requests yet: drop it")
    for name, neutral in (("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0)):
        if getattr(params, name, neutral) != neutral:
            out.append(f"{name} is not applied by the engine's RPT step yet: drop it, or decode with rpt.sampling.generate")
    for name in ("logit_bias", "allowed_token_ids", "bad_words"):
        if getattr(params, name, None):
            out.append(f"{name} is not applied by the engine's RPT step yet: drop it")
    return out


def parse_settings(params, trained_window: int | None, source: str, max_new_tokens: int = 1
                   ) -> RPTSettings | None:
    """The request's settings (None: a plain request); :class:`RPTSettingError` naming the problem
    and the fix otherwise. ``trained_window``: the checkpoint's window (None: it has no offset table)."""
    extra = getattr(params, "extra_args", None) or {}
    if not asks_for_rpt(extra):
        return None
    if "rpt_iters" not in extra:
        asked = sorted(k for k in KEYS if k in extra)
        raise RPTSettingError(f"extra_args {asked} without 'rpt_iters': add rpt_iters=k (e.g. 1) to decode with RPT")
    values: dict[str, Any] = {k: extra[k] for k in KEYS if k in extra}
    for key in ("ptp_greedy", "penalize_ptp"):
        if key in values:
            values[key] = _flag(values[key], key)
    iters = values["rpt_iters"]
    if isinstance(iters, float) and not math.isfinite(iters):
        raise RPTSettingError(f"extra_args rpt_iters={iters!r} is invalid: use an integer in [0, {MAX_ITERS}]")
    if isinstance(iters, int) and not isinstance(iters, bool) and iters > MAX_ITERS:
        raise RPTSettingError(f"extra_args rpt_iters={iters} is above the engine's bound {MAX_ITERS} (each iteration "
                              f"can cost a step per token); use at most {MAX_ITERS} (the paper: 1 or 2)")
    temperature = float(getattr(params, "temperature", 0.0) or 0.0)
    top_k = getattr(params, "top_k", 0) or 0
    seed = getattr(params, "seed", None)
    try:
        config = SamplingConfig(
            max_new_tokens=max(int(max_new_tokens), 1), eos_token_id=[], seed=seed,
            temperature=0.0 if temperature < _EPS else temperature, top_k=max(int(top_k), 0),
            top_p=float(getattr(params, "top_p", 1.0)), min_p=float(getattr(params, "min_p", 0.0)), **values)
    except ValueError as e:  # SamplingConfig's message names the field and the fix
        raise RPTSettingError(f"extra_args {str(e).removeprefix('SamplingConfig.')}") from None
    if config.rpt_iters == 0:
        return None
    if trained_window is None:
        raise RPTSettingError(f"extra_args rpt_iters={config.rpt_iters} needs an RPT checkpoint, but {source} has no "
                              "rpt_config.json / offset table: serve a checkpoint saved by RPTForCausalLM.save_pretrained")
    try:
        check_window_covers(trained_window, config.rpt_window, source)
    except ValueError as e:
        raise RPTSettingError(f"extra_args {e}") from None
    refused = refusals(params)
    if refused:
        raise RPTSettingError(refused[0])
    base = int(torch.randint(0, 2**62, ())) if seed is None else int(seed)
    return RPTSettings(config, row_seed(base, 0))


def rpt_budget(prompt_length: int, max_tokens: int, max_model_len: int, window: int) -> int:
    """The tokens an RPT request may generate: ``max_tokens``, within the context less the slots its
    last step's chains take (``w(w-1)/2`` past the newest token) and the engine's re-fed row."""
    return max(min(max_tokens, max_model_len - 1 - prompt_length - window * (window - 1) // 2), 0)
