"""A request's RPT settings checked where vLLM admits it, so a bad one is an HTTP 400 under
``vllm serve`` (a ``VLLMValidationError`` from ``LLM.generate``) and never reaches the engine.

vLLM's one per-request admission hook open to a plugin is the ``validate_params`` of the installed
logits processors (the LZ penalty's, :mod:`rpt.integrations.vllm`), and it is handed only the
request's ``SamplingParams``. Which engine admits the request -- an RPT engine, and which checkpoint,
or a plain one -- is read from the caller, vLLM's ``InputProcessor`` (its ``vllm_config``; an internal
named in :mod:`.internals`). In an RPT engine the request gets every check the scheduler makes
(trained window, offset table, ranges, refusals); in a plain engine an RPT request is refused (it
would silently decode as NTP); where the caller cannot be found, the checks that need no checkpoint
run, and the RPT scheduler still makes the rest (:mod:`.scheduler`).
"""

from __future__ import annotations

import sys

from rpt.checkpoint.rpt_config import MAX_WINDOW, read_rpt_config
from rpt.integrations.vllm_rpt.settings import RPTSettingError, asks_for_rpt, parse_settings

_RPT_SCHEDULER = "rpt.integrations.vllm_rpt.scheduler.RPTScheduler"
_SEARCH_DEPTH = 8  # frames between InputProcessor._validate_params and a processor's validate_params: 2


def admitting_config():
    """The ``vllm_config`` of the ``InputProcessor`` up the call stack, or None."""
    frame = sys._getframe(1)
    for _ in range(_SEARCH_DEPTH):
        frame = frame.f_back
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if type(owner).__name__ == "InputProcessor" and hasattr(owner, "vllm_config"):
            return owner.vllm_config
    return None


def is_rpt_engine(vllm_config) -> bool:
    scheduler = getattr(vllm_config.scheduler_config, "scheduler_cls", None)
    name = scheduler if isinstance(scheduler, str) else f"{getattr(scheduler, '__module__', '')}." \
                                                        f"{getattr(scheduler, '__qualname__', '')}"
    return name == _RPT_SCHEDULER


def validate(params) -> None:
    """``RPTSettingError`` (a ``ValueError``: vLLM turns it into a 400) for a request its engine cannot
    decode with RPT; nothing for a plain request."""
    extra = getattr(params, "extra_args", None) or {}
    if not asks_for_rpt(extra):
        return
    config = admitting_config()
    if config is None:  # unknown engine: the checks that need no checkpoint (the scheduler makes the rest)
        parse_settings(params, MAX_WINDOW, "the checkpoint", getattr(params, "max_tokens", None) or 1)
        return
    model = config.model_config
    if is_rpt_engine(config):
        rpt_config = read_rpt_config(model.model, **({"revision": model.revision} if model.revision else {}))
        window = None if rpt_config is None else rpt_config.window
        parse_settings(params, window, model.model, getattr(params, "max_tokens", None) or 1)
        return
    settings = parse_settings(params, MAX_WINDOW, model.model)
    if settings is not None:
        raise RPTSettingError(f"extra_args rpt_iters={settings.config.rpt_iters} needs the RPT engine, but this vLLM "
                              "engine serves the plain model: start it with rpt_engine_args(ckpt) or the vllm serve "
                              "flags of docs/serving.md")
