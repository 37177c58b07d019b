"""Which dtype each matrix product of a step runs in: a CPU-visible symptom of tensor-core use.

A GPU runs a bf16 GEMM on its tensor cores and a float32 one without them (about 15x slower on an
H100/H200), so a float32 product inside a bf16 step is a speed bug that a CPU cannot time but can
see: :class:`GemmCensus` records the FLOPs of every product dispatched while it is active (torch's
own FLOP formulas, ``torch.utils.flop_counter``), keyed by the dtype of its operands.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry


def _formula(func):
    """torch's FLOP formula for ``func``; an in-place product (``addmm_``) counts as its out-of-place form."""
    packet = func._overloadpacket
    if packet not in flop_registry and packet.__name__.endswith("_"):
        packet = getattr(torch.ops.aten, packet.__name__[:-1], packet)
    return packet, flop_registry.get(packet)


def _broadcast_heads(value):
    """The 4-D ``[batch, heads, seq, dim]`` tensors of ``value`` (a tensor or a sequence of them) with fewer
    heads than the most, as meta tensors of that many heads (what GQA's key / value broadcast to)."""
    items = value if isinstance(value, (tuple, list)) else [value]
    heads = max((a.shape[1] for a in items if isinstance(a, torch.Tensor) and a.dim() == 4), default=0)

    def wide(a):
        if isinstance(a, torch.Tensor) and a.dim() == 4 and a.shape[1] < heads and heads % a.shape[1] == 0:
            return torch.empty((a.shape[0], heads, *a.shape[2:]), dtype=a.dtype, device="meta")
        return a

    return type(value)(wide(a) for a in value) if isinstance(value, (tuple, list)) else wide(value)


def _flops(count, args, kwargs, out) -> int:
    """``count``'s FLOPs for one call. torch before 2.12 asserts that an attention call's query, key and
    value have as many heads (``sdpa_flop``: "shapes are incompatible"), which a GQA call (fewer key /
    value heads, broadcast by the kernel) has not: counted then with the key / value heads broadcast."""
    try:
        return int(count(*args, **kwargs, out_val=out))
    except AssertionError:
        return int(count(*_broadcast_heads(args), **kwargs, out_val=_broadcast_heads(out)))


def _first_tensor(args) -> torch.Tensor | None:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a
    return None


class GemmCensus(TorchDispatchMode):
    """``with GemmCensus() as census: step()``; then ``census.flops[dtype]`` and ``census.share(dtype)``.

    ``census.shapes[dtype]`` counts each ``(op, operand shapes)`` seen, to name the products of a
    dtype that should not be there.
    """

    def __init__(self):
        super().__init__()
        self.flops: Counter = Counter()
        self.shapes: dict[torch.dtype, Counter] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet, count = _formula(func)
        # addmm / baddbmm: the accumulator comes first; the product's operands decide the unit that runs it
        operand = _first_tensor(args[1:] if packet in (torch.ops.aten.addmm, torch.ops.aten.baddbmm) else args)
        if count is not None and operand is not None:
            self.flops[operand.dtype] += _flops(count, args, kwargs, out)
            key = (func._overloadpacket.__name__, *(tuple(a.shape) for a in args if isinstance(a, torch.Tensor)))
            self.shapes.setdefault(operand.dtype, Counter())[key] += 1
        return out

    @property
    def total(self) -> int:
        return sum(self.flops.values())

    def share(self, dtype: torch.dtype) -> float:
        """The fraction of all counted FLOPs whose operands are ``dtype``."""
        return self.flops[dtype] / self.total if self.total else 0.0
