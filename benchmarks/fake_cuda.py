"""Inductor's CUDA (Triton) scheduling of a function's graph, on a machine without a GPU: a development
check, not a run (``benchmarks/rpt_tail_compile.py --fake-cuda``).

A CUDA compile failure of inductor's *scheduler* -- a fusion decision, such as the H100's
``assert rnumel1 == 1 and rnumel2 != 1`` in ``codegen/simd.py``'s ``can_fuse_horizontal`` on the RPT
step at batch 1 -- happens before any kernel is compiled, so it can be reproduced on the CPU:

1. dynamo traces the function on CPU tensors (the code's CUDA branches taken: :data:`CUDA_BRANCHES`),
   ``make_fx`` lowers the graph to aten operations, and every device argument in it becomes ``cuda``;
2. inductor compiles that graph on fake CUDA tensors, with ``torch.cuda`` answering as one H100
   would (a fake device guard registered from a two-line C++ extension, the device properties
   patched), up to the scheduler's fusion; the code generation is stopped there (no Triton kernel
   is compiled, no driver is needed).

Needs ``triton`` importable (inductor's CUDA path imports it: ``pip install --target DIR triton`` and
``PYTHONPATH=DIR``) and a C++ compiler. It patches torch internals, so it follows torch's version: it
was written against torch 2.13 (where it reproduced the H100's batch-1 crash of the RPT step's tail,
and the tail restructured since schedules at every batch); on another version it may need changes,
and a check that passes here is evidence, not a GPU run.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

_GUARD = r"""
#include <torch/extension.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/FakeGuardImpl.h>
C10_REGISTER_GUARD_IMPL(CUDA, c10::impl::FakeGuardImpl<c10::DeviceType::CUDA>);
int registered() { return 1; }
"""


def _register_fake_cuda_guard() -> None:
    """A device guard for CUDA in a CPU build (``aten`` code that switches devices needs one)."""
    from torch.utils.cpp_extension import load_inline

    load_inline("rpt_fake_cuda_guard", cpp_sources=_GUARD, functions=["registered"], verbose=False)


def _cuda_argmax(scores: torch.Tensor) -> torch.Tensor:
    return scores.argmax(-1)


def _cuda_inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    from rpt.sampling.randomness import _sequential

    return _sequential(probs, u)


# the code's branches on the tensors' device, taken as on CUDA while tracing on CPU tensors
CUDA_BRANCHES = {"rpt.sampling.proposals.first_argmax": _cuda_argmax,
                 "rpt.sampling.proposals.inverse_cdf": _cuda_inverse_cdf}


class _Scheduled(Exception):
    pass


class _H100:
    multi_processor_count, major, minor, name = 132, 9, 0, "NVIDIA H100 80GB HBM3"
    total_memory, regs_per_multiprocessor, max_threads_per_multi_processor = 80 * 2**30, 65536, 2048
    warp_size, L2_cache_size, shared_memory_per_block_optin = 32, 50 * 2**20, 232448
    max_threads_per_block, shared_memory_per_multiprocessor, gcnArchName = 1024, 233472, ""


def _aten_graph(fn, *args):
    """``fn``'s dynamo graph on the given CPU arguments, as aten operations, and its example inputs."""
    from torch.fx.experimental.proxy_tensor import make_fx

    box = {}

    def backend(gm, example_inputs):
        box["gm"], box["inputs"] = gm, example_inputs
        return gm.forward

    torch._dynamo.reset()
    with contextlib.ExitStack() as stack:
        for target, branch in CUDA_BRANCHES.items():
            stack.enter_context(mock.patch(target, branch))
        torch.compile(fn, backend=backend, fullgraph=True, dynamic=False)(*args)
    return make_fx(box["gm"], tracing_mode="real")(*box["inputs"]), box["inputs"]


def _on_cuda(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    cuda = torch.device("cuda", 0)

    def move(a):
        if isinstance(a, torch.device) and a.type == "cpu":
            return cuda
        if isinstance(a, (list, tuple)):
            return type(a)(move(x) for x in a)
        if isinstance(a, dict):
            return {k: move(v) for k, v in a.items()}
        return "cuda" if isinstance(a, str) and a == "cpu" else a

    for node in gm.graph.nodes:
        node.args, node.kwargs = move(node.args), move(node.kwargs)
    gm.recompile()
    return gm


def _pretend_one_h100() -> list:
    iface = "torch._dynamo.device_interface.CudaInterface"
    return [mock.patch("torch.cuda.is_available", lambda: True),
            mock.patch("torch.cuda.device_count", lambda: 1),
            mock.patch("torch.cuda.current_device", lambda: 0),
            mock.patch("torch.cuda.get_device_properties", lambda *a, **k: _H100()),
            mock.patch("torch.cuda.get_device_capability", lambda *a, **k: (9, 0)),
            mock.patch("torch.cuda.get_rng_state", lambda *a, **k: torch.zeros(16, dtype=torch.uint8)),
            mock.patch("torch.cuda.set_rng_state", lambda *a, **k: None),
            mock.patch("torch.cuda._lazy_init", lambda *a, **k: None),
            mock.patch("torch.cuda.is_initialized", lambda: True),
            mock.patch("torch.cuda._exchange_device", lambda idx: 0),
            mock.patch("torch.cuda._maybe_exchange_device", lambda idx: 0),
            mock.patch("torch.utils._triton.has_triton", lambda *a, **k: True),
            mock.patch("torch._inductor.scheduler.has_triton", lambda *a, **k: True),
            # the pattern tables would be built with real CUDA tensors (the tail needs none of them), and
            # the folding of uniform constants evaluates them on the device (they stay ops, inlined)
            mock.patch("torch._inductor.fx_passes.joint_graph.lazy_init", lambda *a, **k: None),
            mock.patch("torch._inductor.fx_passes.joint_graph.constant_fold_uniform_value", lambda gm: None),
            mock.patch(f"{iface}.get_device_properties", staticmethod(lambda *a, **k: _H100())),
            mock.patch(f"{iface}.current_device", staticmethod(lambda: 0)),
            mock.patch(f"{iface}.device_count", staticmethod(lambda: 1)),
            mock.patch(f"{iface}.get_raw_stream", staticmethod(lambda i: 0)),
            mock.patch(f"{iface}.exchange_device", staticmethod(lambda i: 0)),
            mock.patch(f"{iface}.maybe_exchange_device", staticmethod(lambda i: 0)),
            mock.patch(f"{iface}.is_bf16_supported", staticmethod(lambda *a, **k: True))]


def schedule_on_fake_cuda(fn, *args) -> int:
    """Inductor's CUDA scheduling of ``fn``'s graph (``args``: CPU tensors and Python objects, as a
    call on CPU would take): raises what lowering or fusion raises; returns the scheduled node count."""
    import torch._inductor.config as inductor_config
    from torch._inductor import scheduler
    from torch._inductor.compile_fx import compile_fx

    _register_fake_cuda_guard()
    gm, inputs = _aten_graph(fn, *args)
    gm = _on_cuda(gm)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        fake = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda")
                if isinstance(t, torch.Tensor) else t for t in inputs]
    nodes = {}

    def stop_after_fusion(self):
        nodes["count"] = len(self.nodes)
        raise _Scheduled

    with contextlib.ExitStack() as stack:
        for patch in [mock.patch.object(scheduler.Scheduler, "codegen", stop_after_fusion), *_pretend_one_h100()]:
            stack.enter_context(patch)
        stack.enter_context(inductor_config.patch(fx_graph_cache=False, autotune_local_cache=False))
        try:
            with mode:
                compile_fx(gm, fake)
        except Exception as error:
            cause = error
            while cause is not None and not isinstance(cause, _Scheduled):
                cause = cause.__cause__ or cause.__context__
            if cause is None:
                raise
    return nodes["count"]
