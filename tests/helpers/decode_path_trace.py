"""How far ``model`` travels from ``generate`` to the model's forward: the Python calls on the way.

:func:`trace_model_path` runs a decode under :func:`sys.setprofile` and, at every model call (the fused
:class:`~rpt.decode_forward.llama_forward.DecodeModel` call, or the model's own ``forward``), records the
chain of ``rpt`` frames from ``generate`` down to it that receive the model: a frame one of whose
arguments is the model, its :class:`~rpt.decode_forward.queries.ModelQueries` /
:class:`~rpt.decode_forward.llama_forward.DecodeModel` wrapper, or an object holding one of those as an
attribute (the decode's driver, the pooled buffers). :class:`ModelPath` summarises the chains: the
distinct stops (functions), the distinct modules, and per module the most times one chain enters it
(a run of consecutive frames in one module is one entry).

Used by ``tests/sampling/decode/test_decode_path.py``; runnable on any checkout (``python -m tests.helpers.decode_path_trace``
prints the numbers of the current one).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType

import rpt
from rpt.decode_forward.llama_forward import DecodeModel
from rpt.decode_forward.queries import ModelQueries

RPT_ROOT = os.path.dirname(os.path.abspath(rpt.__file__))


@dataclass(frozen=True)
class Stop:
    module: str  # dotted module name
    function: str  # qualified name


@dataclass
class ModelPath:
    """The chains of one or more decodes (each chain: its stops from ``generate`` to the model call)."""

    chains: set[tuple[Stop, ...]] = field(default_factory=set)

    @property
    def stops(self) -> set[Stop]:
        return {stop for chain in self.chains for stop in chain}

    @property
    def modules(self) -> set[str]:
        return {stop.module for stop in self.stops}

    def entries(self) -> dict[str, int]:
        """Per module, the most times a single chain enters it."""
        most: dict[str, int] = {}
        for chain in self.chains:
            counts: dict[str, int] = {}
            previous = None
            for stop in chain:
                if stop.module != previous:
                    counts[stop.module] = counts.get(stop.module, 0) + 1
                previous = stop.module
            for module, count in counts.items():
                most[module] = max(most.get(module, 0), count)
        return most

    def within(self, package: str) -> ModelPath:
        """The chains' stops in ``package`` (a dotted prefix) only."""
        return ModelPath({tuple(s for s in chain if s.module.startswith(package + ".")) for chain in self.chains})

    def longest(self) -> tuple[Stop, ...]:
        return max(self.chains, key=len, default=())

    def summary(self) -> str:
        entries = self.entries()
        worst = max(entries.values(), default=0)
        lines = [f"{len(self.stops)} stops in {len(self.modules)} modules over {len(self.chains)} chains; "
                 f"longest chain {len(self.longest())} stops; most entries of one module in a chain {worst}"]
        lines += [f"  {module}: entered {count}x" for module, count in sorted(entries.items())]
        return "\n".join(lines)


def _module_of(frame: FrameType) -> str:
    path = os.path.abspath(frame.f_code.co_filename)
    relative = os.path.relpath(path, os.path.dirname(RPT_ROOT))
    return relative[:-3].replace(os.sep, ".") if relative.endswith(".py") else relative


def _in_rpt(frame: FrameType) -> bool:
    return os.path.abspath(frame.f_code.co_filename).startswith(RPT_ROOT + os.sep)


def _arguments(frame: FrameType) -> list:
    code = frame.f_code
    count = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
    values = []
    for name in code.co_varnames[:count]:
        value = frame.f_locals.get(name)
        values.extend(value if isinstance(value, tuple) else value.values() if isinstance(value, dict) else [value])
    return values


def _carries(value, model) -> bool:
    """The model, its wrapper, or an object holding one of them (one attribute level)."""
    if value is model or isinstance(value, (ModelQueries, DecodeModel)):
        return True
    attributes = getattr(value, "__dict__", None)
    if not isinstance(attributes, dict) or isinstance(value, type):
        return False
    return any(v is model or isinstance(v, (ModelQueries, DecodeModel)) for v in list(attributes.values()))


def trace_model_path(decode: Callable[[], object], model, entry: Callable, carrying_only: bool = True,
                     reach: bool = False) -> ModelPath:
    """Run ``decode()`` and record, at every model call, the chain from the frame of ``entry`` (the
    ``generate`` function) down to the model call, of the ``rpt`` frames that receive ``model`` (every
    ``rpt`` frame: ``carrying_only=False``). ``reach``: record the chain at every call of an ``rpt``
    function that receives the model, not only at the model calls (everywhere ``model`` goes)."""
    entry_code = entry.__code__
    forwards = {DecodeModel.__call__.__code__, type(model).forward.__code__}
    path = ModelPath()
    in_rpt: dict = {}

    def profile(frame: FrameType, event: str, arg) -> None:
        if event != "call":
            return
        if frame.f_code not in forwards:
            if not reach:
                return
            code = frame.f_code
            if code not in in_rpt:
                in_rpt[code] = _in_rpt(frame)
            if not in_rpt[code] or not any(_carries(v, model) for v in _arguments(frame)):
                return
        chain: list[Stop] = []
        f: FrameType | None = frame
        while f is not None:
            if _in_rpt(f) and (not carrying_only or any(_carries(v, model) for v in _arguments(f))):
                chain.append(Stop(_module_of(f), f.f_code.co_qualname))
            if f.f_code is entry_code:
                break
            f = f.f_back
        if f is None:
            return  # a model call outside the decode (none is expected)
        path.chains.add(tuple(reversed(chain)))

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        decode()
    finally:
        sys.setprofile(previous)
    return path


def tiny_decodes_path(carrying_only: bool = True, reach: bool = False) -> ModelPath:
    """The chains of two tiny decodes of a random Llama RPT model: a greedy RPT decode with corrections and
    a plain NTP decode (eager, three left-padded rows)."""
    from rpt.sampling.config import SamplingConfig
    from rpt.sampling.decode.generate import generate
    from tests.sampling.decode.test_decoder import prompts, rpt_model

    model = rpt_model(3)
    ids, mask = prompts(3)
    path = ModelPath()
    for cfg in (SamplingConfig(max_new_tokens=10, rpt_iters=2, rpt_window=3, confidence=0.0, eos_token_id=[]),
                SamplingConfig(max_new_tokens=6, eos_token_id=[])):
        one = trace_model_path(lambda cfg=cfg: generate(model, ids, cfg, attention_mask=mask), model, generate,
                               carrying_only, reach)
        path.chains |= one.chains
    return path


if __name__ == "__main__":
    verbose = "-v" in sys.argv
    for carrying, reach, title in ((True, False, "to the model call, frames receiving the model"),
                                   (False, False, "to the model call, every rpt frame"),
                                   (True, True, "everywhere the model goes")):
        traced = tiny_decodes_path(carrying, reach)
        print(f"{title}: {traced.summary()}")
        print(f"  of which in rpt.sampling.decode: {traced.within('rpt.sampling.decode').summary().splitlines()[0]}")
        if verbose:
            for chain in sorted(traced.chains, key=len, reverse=True):
                print("\n".join(f"    {s.module}.{s.function}" for s in chain) + "\n")
