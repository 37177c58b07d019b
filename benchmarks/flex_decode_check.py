"""The decode's compiled attention on its own: flex attention with eq. 4's rule as ``score_mod`` against sdpa
with the same rule as a boolean mask, at the shapes the decode compiles (Llama-3.2-1B's heads), in seconds.

    python benchmarks/flex_decode_check.py --device cuda               # bf16, what a GPU pass runs first
    python benchmarks/flex_decode_check.py --device cpu --dtype float32 --backend aot_eager   # a smoke test

For every query block the decode compiles -- an NTP step (1 query), RPT steps (2 and 4 queries: x_n and
its PTP chains, which see the sequence up to a limit and their own chain), prefills (16 and 64) -- at
batch 1 and 16 with ragged rows, over a 256-column cache, it compiles ``rpt.decode_forward.llama_forward``'s attention
(``fullgraph``; on CUDA inductor's flex decoding / flex attention kernels) and prints the largest
difference from sdpa and the time per call of both. Exit status 1 if any block fails to compile or differs
by more than ``--tolerance``: the decode would then fail to compile there (or compute something else),
and ``rpt.decode_forward.llama_forward.FLEX_DEVICES`` is what to take the device out of.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from rpt.decode_forward import llama_forward as decode_model
from rpt.decode_forward.visibility import Visibility


def block(batch: int, q: int, capacity: int, device) -> tuple[Visibility, torch.Tensor]:
    """A decode call's visibility at column 100: rows padded by 0 or 5, x_n and PTP chains (or a prefill)."""
    pads = torch.tensor([0, 5] * (batch // 2) + [0] * (batch % 2), device=device)
    if q >= 16:  # a prefill of the first q columns
        columns = torch.arange(q, device=device)
        return Visibility(columns, pads, None), columns
    n = 100
    columns, limit, since = [n], [n], [n]
    lag, first = 1, n + 1
    while len(columns) < q:  # one chain per lag: x_{n-lag+1} .. x_n in scratch columns past n
        for m in range(min(lag, q - len(columns))):
            columns.append(first + m)
            limit.append(n - lag - 1)
            since.append(first)
        first += lag
        lag += 1
    t = lambda v: torch.tensor(v, device=device)  # noqa: E731
    return Visibility(t(limit), pads, t(since)), t(columns)


def attend(qs, ks, vs, limit, start, since, columns):
    """The decode's attention of one call: compiled, flex attention (the device is in FLEX_DEVICES); eager,
    sdpa with the boolean mask."""
    attention = decode_model._attention(Visibility(limit, start, since), columns, qs.shape[0], qs, ks.shape[2],
                                        plain=False)
    return attention(qs, ks, vs, qs.shape[-1] ** -0.5)


def per_call_us(fn, inputs: tuple, device: torch.device, calls: int = 20) -> float:
    fn(*inputs)
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn(*inputs)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])  # not DTYPES: a tolerance each
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--capacity", type=int, default=256)
    ap.add_argument("--tolerance", type=float, default=None, help="largest |flex - sdpa| (default 2e-2 bf16, 1e-5 fp32)")
    args = ap.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    tolerance = args.tolerance or (2e-2 if dtype == torch.bfloat16 else 1e-5)
    decode_model.FLEX_DEVICES.add(device.type)
    heads, kv_heads, dim = 32, 8, 64
    print(f"torch {torch.__version__}, {device}, {args.dtype}, backend {args.backend}, capacity {args.capacity}, "
          f"{heads} query heads on {kv_heads} KV heads of {dim}")
    failed = 0
    for batch in (1, 16):
        for q in (1, 2, 4, 16, 64):
            vis, columns = block(batch, q, args.capacity, device)
            g = torch.Generator(device=device).manual_seed(q)
            qs = torch.randn(batch, heads, q, dim, device=device, dtype=dtype, generator=g)
            ks, vs = (torch.randn(batch, kv_heads, args.capacity, dim, device=device, dtype=dtype, generator=g)
                      for _ in range(2))

            torch._dynamo.reset()
            compiled = torch.compile(attend, backend=args.backend, fullgraph=True, dynamic=False)
            inputs = (qs, ks, vs, vis.limit, vis.start, vis.since, columns)
            try:
                start = time.perf_counter()
                got = compiled(*inputs)
                compile_s = time.perf_counter() - start
            except Exception as error:  # report and go on: every block is checked
                print(f"batch {batch:2d} queries {q:2d}: FAILED to compile: {type(error).__name__}: "
                      f"{str(error).splitlines()[0][:200]}")
                failed += 1
                continue
            want = attend(*inputs)  # eager: sdpa with the same rule as a boolean mask
            diff = (got.float() - want.float()).abs().max().item()
            times = [per_call_us(fn, inputs, device) for fn in (compiled, attend)]
            ok = diff <= tolerance
            failed += not ok
            print(f"batch {batch:2d} queries {q:2d}: max |flex - sdpa| {diff:.2e} {'ok' if ok else 'TOO LARGE'}; "
                  f"compiled flex {times[0]:8.1f} us, eager sdpa + mask {times[1]:8.1f} us; compile {compile_s:.1f} s")
    print("PASS" if not failed else f"FAIL: {failed} block(s)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
