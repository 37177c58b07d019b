r"""Compile failures on the decode path, told apart from the decode's own errors, and the strict mode.

A compiled decode (``generate(compile=True)``) can fail where no test on one machine reaches: an
inductor assertion on another GPU or torch version (the RPT step crashed inductor's CUDA scheduler at
batch 1 on an H100), dynamo's recompile limit over many batch shapes in one evaluation process, a
CUDA graph that cannot be captured. Every ``torch.compile``'d callable of the decode runs through
:func:`guarded`, which turns an exception raised while it runs (tracing, compiling, capturing or
replaying) into a :class:`CompileFailure`; ``generate`` then restarts that decode eagerly from the
prompt (the failed attempt may have mutated its buffers: warm-up and capture run the step in place),
warns once, and records the failure in ``out.stats["compile_fallback"]``, so that a benchmark never
reports eager numbers as compiled ones. A decode's own errors (NaN logits, bad inputs) are raised on
the host, outside every guarded call, and pass through unchanged.

**Strict mode** (``RPT_STRICT_COMPILE=1``, what the tests and ``make bench-gpu`` set): the failure is
raised instead of falling back.

**The decode's dynamo settings** (:func:`dynamo_patch`: the raised recompile limit of its compiled calls,
:func:`decode_dynamo_settings`) are patched so that two decodes in two threads may overlap and leave
the process's config as it was.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import traceback
from collections.abc import Callable

import torch

from rpt.shared_switch import switched

STRICT_ENV = "RPT_STRICT_COMPILE"


def strict() -> bool:
    """Whether a compile failure raises (``RPT_STRICT_COMPILE`` set to anything but ``""`` or ``0``)."""
    return os.environ.get(STRICT_ENV, "") not in ("", "0")


def describe(error: BaseException) -> str:
    """One line naming the torch version and the error: its type, the type, first line and place of the
    error it wraps (dynamo and inductor wrap the backend's own: ``BackendCompilerFailed``,
    ``InductorError``), e.g. ``torch 2.11.0: InductorError: AssertionError at
    torch/_inductor/codegen/simd.py:2142 (can_fuse_horizontal)``."""
    root, seen = error, {id(error)}
    while True:
        inner = getattr(root, "inner_exception", None) or root.__cause__
        if inner is None or id(inner) in seen:
            break
        seen.add(id(inner))
        root = inner
    lines = [line.strip() for line in str(root).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if len(text) > 300:
        text = text[:297] + "..."
    where = ""
    frames = traceback.extract_tb(root.__traceback__) if root.__traceback__ is not None else []
    if frames:
        last = frames[-1]
        path = last.filename.replace(os.sep, "/")
        path = path[path.rfind("torch/"):] if "torch/" in path else os.path.basename(path)
        where = f" at {path}:{last.lineno} ({last.name})"
    head = type(error).__name__ if root is error else f"{type(error).__name__}: {type(root).__name__}"
    return f"torch {torch.__version__}: {head}{where}" + (f": {text}" if text else "")


class CompileFailure(RuntimeError):
    """A compiled callable of the decode failed (``error``, its cause); the message is :func:`describe`'s."""

    def __init__(self, error: BaseException | str):
        self.error = error if isinstance(error, BaseException) else None
        super().__init__(describe(error) if isinstance(error, BaseException) else error)


def guarded(fn: Callable) -> Callable:
    """``fn`` (a compiled callable), raising :class:`CompileFailure` from whatever it raises."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except CompileFailure:
            raise
        except Exception as error:  # noqa: BLE001 -- anything raised inside a compiled region is its failure
            raise CompileFailure(error) from error

    return call


@functools.cache
def _patches_are_thread_local() -> bool:
    """Whether ``torch._dynamo.config.patch`` changes the config for the calling thread only (torch's
    thread-local config layer; before it, a patch was process-wide). Probed once: a patch seen from
    another thread is process-wide."""
    config, seen = torch._dynamo.config, []
    with config.patch(recompile_limit=config.recompile_limit + 1):
        probe = threading.Thread(target=lambda: seen.append(config.recompile_limit))
        probe.start()
        probe.join()
    return seen[0] == config.recompile_limit


def dynamo_patch(**values) -> contextlib.AbstractContextManager:
    """``torch._dynamo.config.patch(**values)`` that two decodes in two threads may overlap: thread-local
    where torch's patches are; elsewhere set by the first thread to enter and restored by the last
    (:mod:`rpt.shared_switch`), so that the process's config ends as it was (saved and restored by each,
    the second would restore the first's patched value last)."""
    config = torch._dynamo.config
    if _patches_are_thread_local():
        return config.patch(**values)
    key = ("torch._dynamo.config", *sorted(values.items()))

    def switch() -> dict:
        saved = {name: getattr(config, name) for name in values}
        for name, value in values.items():
            setattr(config, name, value)
        return saved

    def restore(saved: dict) -> None:
        for name, value in saved.items():
            setattr(config, name, value)

    return switched(key, switch, restore)


def decode_dynamo_settings() -> contextlib.AbstractContextManager:
    """The dynamo settings a compiled decode runs under (patched for the decode, the user's back after it):

    * ``fail_on_recompile_limit_hit``: dynamo raises ``FailOnRecompileLimitHit`` at its recompile limit
      instead of silently running the frame eagerly from then on (a decode reported as compiled that is
      not): the failure a guarded call turns into a fallback with a warning (torch 2.6 and later);
    * ``suppress_errors`` off (a user's ``torch._dynamo.config.suppress_errors = True``, common in
      notebooks): dynamo refuses it beside the option above (an AssertionError at every compiled call),
      and with it a failed compile would run silently eagerly instead of being told apart; the decode's
      own fallback already does what the user asked of it (an eager run, warned);
    * ``skip_nnmodule_hook_guards`` off: the graphs guard on the modules' hooks, so a forward hook added
      or removed after a compiled decode re-traces the model's forward (dynamo's default would keep
      running the graph traced without it)."""
    values = dict(suppress_errors=False, skip_nnmodule_hook_guards=False)
    if hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):
        values["fail_on_recompile_limit_hit"] = True
    return dynamo_patch(**values)
