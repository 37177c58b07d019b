"""Which dtype each matrix product of a step runs in: a CPU-visible symptom of tensor-core use.

A GPU runs a bf16 GEMM on its tensor cores and a float32 one without them (about 15x slower on an
H100/H200), so a float32 product inside a bf16 step is a speed bug that a CPU cannot time but can
see: :class:`GemmCensus` records the FLOPs of every product dispatched while it is active (torch's
own FLOP formulas, ``torch.utils.flop_counter``), keyed by the dtype of its operands.

Attention is counted on any torch and any device: a grouped-query call hands the kernel k/v with fewer
heads than q (torch 2.11's formula asserts on that; the kernels broadcast them), so the shapes go to
torch's formula with k/v at the query's head count, which is what the kernels compute; and the CPU's
fused kernel, which torch's registry does not name, is counted with the formula of the CUDA one.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

aten = torch.ops.aten


def _ops(table: dict[str, object]) -> dict:
    """``{op packet: value}`` for the ops of ``table`` that this torch has (the GPU machines run an older one)."""
    return {getattr(aten, name): value for name, value in table.items() if hasattr(aten, name)}


# The attention ops: (index of q in the arguments, the dim of the heads in q, k and v); k and v follow q.
ATTENTION = _ops({
    "_scaled_dot_product_flash_attention": (0, 1),
    "_scaled_dot_product_efficient_attention": (0, 1),
    "_scaled_dot_product_cudnn_attention": (0, 1),
    "_scaled_dot_product_flash_attention_for_cpu": (0, 1),
    "_scaled_dot_product_flash_attention_backward": (1, 1),  # (grad_out, q, k, v, ...)
    "_scaled_dot_product_efficient_attention_backward": (1, 1),
    "_scaled_dot_product_cudnn_attention_backward": (1, 1),
    "_scaled_dot_product_flash_attention_for_cpu_backward": (1, 1),
    "_flash_attention_forward": (0, -2),  # [batch, seq, heads, dim] (varlen: [tokens, heads, dim])
    "_efficient_attention_forward": (0, -2),
    "_flash_attention_backward": (1, -2),
    "_efficient_attention_backward": (1, -2),
})
# Ops torch's registry has no formula for, counted with the formula of the op that computes the same.
SAME_AS = {getattr(aten, cpu): getattr(aten, cuda) for cpu, cuda in (
    ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention"),
    ("_scaled_dot_product_flash_attention_for_cpu_backward", "_scaled_dot_product_flash_attention_backward"),
) if hasattr(aten, cpu) and hasattr(aten, cuda)}


def _formula(func):
    """torch's FLOP formula for ``func``; an in-place product (``addmm_``) counts as its out-of-place form."""
    packet = func._overloadpacket
    if packet not in flop_registry and packet.__name__.endswith("_"):
        packet = getattr(torch.ops.aten, packet.__name__[:-1], packet)
    return packet, flop_registry.get(SAME_AS.get(packet, packet))


def heads_matched(packet, args: tuple) -> tuple:
    """``args`` of an attention op with k and v standing at the query's head count (shape-only meta
    tensors: the formulas read shapes): grouped-query k/v as the kernel broadcasts them."""
    if packet not in ATTENTION:
        return args
    q_at, dim = ATTENTION[packet]
    q = args[q_at]
    args = list(args)
    for i in (q_at + 1, q_at + 2):  # k, v
        kv = args[i]
        if isinstance(kv, torch.Tensor) and not kv.is_nested and kv.dim() == q.dim() and kv.shape[dim] != q.shape[dim]:
            shape = list(kv.shape)
            shape[dim] = q.shape[dim]
            args[i] = torch.empty(shape, dtype=kv.dtype, device="meta")
    return tuple(args)


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
            self.flops[operand.dtype] += int(count(*heads_matched(packet, args), **kwargs, out_val=out))
            key = (func._overloadpacket.__name__, *(tuple(a.shape) for a in args if isinstance(a, torch.Tensor)))
            self.shapes.setdefault(operand.dtype, Counter())[key] += 1
        return out

    @property
    def total(self) -> int:
        return sum(self.flops.values())

    def share(self, dtype: torch.dtype) -> float:
        """The fraction of all counted FLOPs whose operands are ``dtype``."""
        return self.flops[dtype] / self.total if self.total else 0.0
