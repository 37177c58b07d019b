"""Compile the RPT common step's sampling tail alone -- everything after its model call -- on logits of a
real vocabulary, at several batch sizes: the part of the step that crashed inductor at batch 1 on an H100.

    python benchmarks/rpt_tail_compile.py --device cuda                      # [B, 2, 128256] bf16, B = 1 2 4 16
    python benchmarks/rpt_tail_compile.py --vocab 4096 --backend aot_eager   # CPU, seconds
    python benchmarks/rpt_tail_compile.py --fake-cuda                        # CPU: inductor's CUDA scheduler

No model: a decode state (:class:`rpt.sampling.decode.state.DecodeState`, static buffers as a compiled
decode's) with 64-token prompts, and random ``[B, w, V]`` logits with one clear maximum per query.
For each sampling set-up (``--configs``: greedy; sampled k = 1 with top-k / top-p; greedy with the LZ
and repetition penalties) and batch size, :func:`rpt.sampling.decode.rpt_path.step_tail` -- the NTP and
PTP proposals with their processors, the NaN and event flags, the commit -- is compiled as the
decode compiles its step (:func:`rpt.sampling.decode.compile_mode.compile_step`: on CUDA with inductor,
``mode="reduce-overhead"``, CUDA graphs), run three times (warm-up, capture, replay), checked against
the same tail run eagerly on a copy of the state (every buffer equal), then replayed ``--repeats``
times. Prints one line per case: compile seconds (the first call), replay microseconds, equal or
not, or the one-line error; exits 1 if any case failed.

``--fake-cuda`` (CPU only; needs ``triton`` importable and a C++ compiler) runs inductor's lowering
and CUDA (Triton) scheduler -- where the H100's ``can_fuse_horizontal`` assertion was raised -- on
fake CUDA tensors, and stops before any kernel is compiled (``benchmarks/fake_cuda.py``): a check of
the graph's fusion on a machine without a GPU, not a run.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from rpt.cli.devices import DTYPES
from rpt.decode_forward.compile_guard import CompileFailure, describe
from rpt.sampling.config import SamplingConfig
from rpt.sampling.decode.compile_mode import compile_step
from rpt.sampling.decode.contexts import RotatedContexts
from rpt.sampling.decode.proposal_layout import ProposalLayout
from rpt.sampling.decode.rpt_path import step_tail
from rpt.sampling.decode.state import DecodeState
from rpt.sampling.proposals import ntp_draws

PROMPT, CAPACITY = 64, 256
CONFIGS = {
    "greedy": dict(rpt_iters=1, confidence=0.9),
    "sampled": dict(rpt_iters=1, confidence=0.2, temperature=0.9, top_k=50, top_p=0.95, seed=1),
    "penalties": dict(rpt_iters=1, confidence=0.9, lz_penalty=0.15, lz_window=64, lz_buffer=16,
                      repetition_penalty=1.2),
}


def tail(s: DecodeState, config: SamplingConfig, layout: ProposalLayout, logits: torch.Tensor, fed: torch.Tensor,
         out: torch.Tensor) -> None:
    """The common step after its model call, at the state's column, on the rotated contexts with the state's
    knob tensor (as compiled: with ``config.traced()``)."""
    step_tail(s, config, s.n, layout, RotatedContexts(config, s.seeds, s.seqs, s.prompt, s.pads, s.knobs), logits, fed,
              out)


def state(config: SamplingConfig, batch: int, vocab: int, device: torch.device, seed: int) -> DecodeState:
    """A decode state at column ``PROMPT + 5`` (every lag of the window reaches a generated token)."""
    g = torch.Generator().manual_seed(seed)
    s = DecodeState.allocate(batch, CAPACITY, ntp_draws(config), 1, device, static=True)
    rows = torch.randint(0, vocab, (batch, PROMPT), generator=g).tolist()
    s.load(rows, PROMPT, [0] * batch, [128] * batch, list(range(batch)), [vocab - 1], 0, config.knob_values())
    s.seqs[:, : PROMPT + 6].copy_(torch.randint(0, vocab, (batch, PROMPT + 6), generator=g))
    s.n.fill_(PROMPT + 5)
    s.alive.fill_(True)
    s.draws.copy_(torch.randint(0, vocab, tuple(s.draws.shape), generator=g))
    return s


def logits_for(batch: int, queries: int, vocab: int, dtype: torch.dtype, device: torch.device, seed: int) -> torch.Tensor:
    """Random logits with one clear maximum per query (no tie for kernels to break differently)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, queries, vocab, generator=g) * 2
    top = torch.randint(0, vocab, (batch, queries, 1), generator=g)
    x.scatter_(-1, top, 12.0)
    return x.to(dtype=dtype, device=device)


def buffers(s: DecodeState, out: torch.Tensor) -> list[torch.Tensor]:
    return [*s.tensors(), out]


def run_case(name: str, batch: int, args, device: torch.device, dtype: torch.dtype) -> tuple[str, bool]:
    """The case's report line, and whether the compiled tail agreed with the eager one."""
    config = SamplingConfig(max_new_tokens=128, rpt_window=args.window, eos_token_id=[], **CONFIGS[name])
    layout = ProposalLayout(ntp_draws(config), True, False, tuple(range(1, args.window)))
    logits = logits_for(batch, args.window, args.vocab, dtype, device, seed=batch)
    eager_s, compiled_s = (state(config, batch, args.vocab, device, seed=batch) for _ in range(2))
    fed = eager_s.draws[:, 0].clone()
    outs = [torch.zeros(batch, layout.width, dtype=torch.long, device=device) for _ in range(2)]
    if args.fake_cuda:
        from fake_cuda import schedule_on_fake_cuda

        nodes = schedule_on_fake_cuda(tail, compiled_s, config.traced(), layout, logits, fed, outs[1])
        return f"scheduled for CUDA: {nodes} fused nodes", True
    # a processor's module-level cache (the LZ tables) is filled eagerly first, as the decode does
    tail(eager_s, config, layout, logits.clone(), fed, outs[0])
    eager_s = state(config, batch, args.vocab, device, seed=batch)
    tail(eager_s, config, layout, logits.clone(), fed, outs[0])
    compiled = compile_step(tail, args.backend, device)
    traced = config.traced()  # as the decode: the float knobs read from the state's tensor
    start = compiled_s.n.clone()
    sync(device)
    t0 = time.perf_counter()
    compiled(compiled_s, traced, layout, logits, fed, outs[1])
    sync(device)
    first = time.perf_counter() - t0
    equal = all(torch.equal(a, b) for a, b in zip(buffers(eager_s, outs[0]), buffers(compiled_s, outs[1])))
    for _ in range(2):  # CUDA-graph trees: a warm-up run, then the capture
        compiled_s.n.copy_(start)
        compiled(compiled_s, traced, layout, logits, fed, outs[1])
    sync(device)
    t0 = time.perf_counter()
    for _ in range(args.repeats):
        compiled_s.n.copy_(start)
        compiled(compiled_s, traced, layout, logits, fed, outs[1])
    sync(device)
    replay = (time.perf_counter() - t0) / args.repeats
    return f"compile+first {first:6.2f} s   replay {replay * 1e6:8.1f} us   equal to eager: {equal}", equal


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--window", type=int, default=2, help="RPT window w: 1 NTP query and w - 1 PTP chains")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 16])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--fake-cuda", action="store_true",
                    help="CPU: run inductor's CUDA scheduler on fake CUDA tensors (needs triton), no kernels")
    args = ap.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    where = "fake CUDA (inductor's Triton scheduler, no kernels)" if args.fake_cuda else str(device)
    print(f"RPT step tail, w = {args.window}: logits [B, {args.window}, {args.vocab}] {args.dtype} on {where}, "
          f"backend {args.backend}, torch {torch.__version__}")
    failed = 0
    with torch.inference_mode():
        for name in args.configs:
            for batch in args.batches:
                torch._dynamo.reset()
                try:
                    line, ok = run_case(name, batch, args, device, dtype)
                except Exception as error:  # noqa: BLE001 -- every case is reported, the run goes on
                    line, ok = f"FAILED {error if isinstance(error, CompileFailure) else describe(error)}", False
                failed += not ok
                print(f"{name:<10} B={batch:<3} {line}", flush=True)
    print(f"{failed} of {len(args.configs) * len(args.batches)} cases failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
