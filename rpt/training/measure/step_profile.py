"""Where a training step's time goes: a ``torch.profiler`` table of its top kernels and the share of time
in matrix products, attention, the loss head, the optimizer, and the elementwise rest.

On a CUDA device the time is the kernels' (each attributed to the operation that launched it), and the
table also gives how busy the device was over the profiled steps' wall time (the rest is the device
waiting for the host). On the CPU, where nothing is launched, it is each operation's own (self) time.

A kernel's category is read from the operation that launched it and the ranges around that one, the
first that applies: inside ``Optimizer.step`` / ``zero_grad`` -> optimizer; inside the tiled loss
(``rpt.model.loss.LinearCrossEntropy``, forward and backward) -> loss head, its matrix products included;
an attention operation -> attention; a matrix product -> gemm; anything else (norms, activations,
rotary, residual adds, copies, inductor's fused kernels) -> elementwise & other.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

CATEGORIES = ("gemm", "attention", "loss head", "optimizer", "elementwise & other")
LOSS_HEAD = "LinearCrossEntropy"  # rpt.model.loss's autograd Function: its forward and backward ranges
GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm", "aten::addmm_",
            "aten::_addmm_activation"}
GEMM_KERNELS = ("gemm", "cutlass", "xmma", "nvjet", "cublas", "wgmma")
ATTENTION_OPS = ("scaled_dot_product", "flash", "efficient", "cudnn")
ATTENTION_KERNELS = ("flash", "pytorch_flash", "fmha", "cudnn_generated_fort_native_sdpa")


def category(chain: list[str], kernel: str = "") -> str:
    """The category of ``kernel`` (CUDA; empty on the CPU) launched by the operation ``chain[0]`` inside the
    ranges ``chain[1:]`` (innermost first)."""
    if any(a.startswith(("Optimizer.step", "Optimizer.zero_grad")) for a in chain):
        return "optimizer"
    if any(LOSS_HEAD in a for a in chain):
        return "loss head"
    if any("attention" in a and any(k in a for k in ATTENTION_OPS) for a in chain) or kernel.startswith(ATTENTION_KERNELS):
        return "attention"
    if any(a in GEMM_OPS for a in chain) or any(k in kernel.lower() for k in GEMM_KERNELS):
        return "gemm"
    return "elementwise & other"


@dataclass
class StepProfile:
    """Per kernel (CUDA) or operation (CPU): calls and total microseconds, and the category of each."""

    device: str
    steps: int
    wall_us: float
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    time_us: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    kind: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, cat: str, us: float) -> None:
        key = f"{name} [{cat}]" if self.kind.get(name, cat) != cat else name  # one name, two categories: two rows
        self.kind[key] = cat
        self.calls[key] += 1
        self.time_us[key] += us

    @property
    def total_us(self) -> float:
        return sum(self.time_us.values())

    def shares(self) -> dict[str, float]:
        """The fraction of the counted time in each category (they add up to 1)."""
        out = dict.fromkeys(CATEGORIES, 0.0)
        for key, us in self.time_us.items():
            out[self.kind[key]] += us / self.total_us if self.total_us else 0.0
        return out

    def table(self, top: int = 15) -> str:
        what = "kernels (device time)" if self.device == "cuda" else "operations (self CPU time)"
        per_step = self.total_us / self.steps / 1e3
        lines = [f"top {top} {what}, {self.steps} step(s), {per_step:.2f} ms per step"
                 + (f", device busy {100 * self.total_us / self.wall_us:.0f}% of the wall time" if self.device == "cuda" else ""),
                 f"{'share':>7} {'ms/step':>9} {'calls':>6}  {'category':<20} name"]
        for key in sorted(self.time_us, key=self.time_us.get, reverse=True)[:top]:
            lines.append(f"{100 * self.time_us[key] / self.total_us:6.1f}% {self.time_us[key] / self.steps / 1e3:9.3f} "
                         f"{self.calls[key] // self.steps:6d}  {self.kind[key]:<20} {key[:110]}")
        lines.append("shares: " + ", ".join(f"{c} {100 * s:.1f}%" for c, s in self.shares().items()))
        return "\n".join(lines)


def _ancestors(event) -> list[str]:
    """The names of the ranges and operations around ``event``, innermost first."""
    names, parent = [], event.cpu_parent
    while parent is not None:
        names.append(parent.name)
        parent = parent.cpu_parent
    return names


def profile_steps(step: Callable[[], None], steps: int = 1, device: torch.device | str = "cpu") -> StepProfile:
    """Run ``step()`` ``steps`` times under ``torch.profiler`` and attribute its time (see the module doc)."""
    from torch.profiler import ProfilerActivity, profile

    kind = torch.device(device).type
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if kind == "cuda" else [])
    with profile(activities=activities) as prof:
        if kind == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        if kind == "cuda":
            torch.cuda.synchronize()
        wall = (time.perf_counter() - start) * 1e6
    result = StepProfile(kind, steps, wall)
    for event in prof.events():
        chain = [event.name, *_ancestors(event)]
        if kind == "cuda":
            for kernel in getattr(event, "kernels", []):  # each kernel is listed under the operation that launched it
                result.add(kernel.name, category(chain, kernel.name), kernel.duration)
        elif event.self_cpu_time_total > 0:
            result.add(event.name, category(chain), event.self_cpu_time_total)
    return result
