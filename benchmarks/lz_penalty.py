"""LZ penalty cost in a decode-like loop, side by side with one elementwise pass over the logits.

Each step the context grows by one token (steady state: the window is already full) and every call
gets fresh logits (a different ``[batch, V]`` tensor, cycled over a pool larger than the CPU caches, as
a model's new logits would be); we time, in
one process, each variant alternated step by step with ``sub_`` (in blocks on cuda), taking medians:

* ``sub_``      : ``scores.sub_(x)``, one elementwise pass over the ``[batch, V]`` logits (the yardstick);
* ``sub``       : ``scores - x``, the same out of place (a fresh ``[batch, V]`` tensor, like any
  out-of-place processor);
* ``processor`` : ``LZPenaltyLogitsProcessor`` with its defaults, as ``generate`` and the RPT decoders
  use it: in place on the logits it is handed (HF copies the model's logits before the processors),
  recomputing the match lengths every call, O(batch * W * B), with no host synchronisation;
* ``copy``      : the same with ``inplace=False`` (a ``[batch, V]`` copy per call);
* ``increm``    : in place, carrying match lengths from step to step (``incremental=True``),
  O(batch * W), at the price of a host read of the tokens per call;
* ``dense``     : ``scores - alpha * lz_penalty(...)`` (the ``[batch, V]`` penalty materialised);
* ``direct``    : the textbook ``[batch, V, W]`` comparison, chunked over V (a few steps only).

Goal: processor <= 2x ``sub_`` at V = 128256, batch 8, W = 512, B = 32, on random and on highly
repetitive text, in the process environment a user has (nothing here tunes the allocator or the
threads unless ``--threads`` is given). Run: ``python benchmarks/lz_penalty.py [--device cuda]``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import time
from collections.abc import Callable

import torch

from rpt.sampling import LZPenaltyLogitsProcessor, lz_match_costs, lz_penalty


def direct_penalty(ctx: torch.Tensor, vocab: int, window: int, buffer: int, chunk: int) -> torch.Tensor:
    """``[batch, V]`` penalty via an explicit ``[batch, V-chunk, W]`` token == v comparison."""
    tokens, cost, _ = lz_match_costs(ctx, window, buffer)
    log_v = math.log2(vocab)
    out = torch.empty(ctx.shape[0], vocab, device=ctx.device)
    for lo in range(0, vocab, chunk):
        v = torch.arange(lo, min(lo + chunk, vocab), device=ctx.device)
        hit = tokens[:, None, :] == v[None, :, None]
        best = torch.where(hit, cost[:, None, :], log_v).amin(-1)
        out[:, lo:lo + len(v)] = log_v - best.clamp(0, log_v)
    return out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_steps(fn: Callable[[int], object], steps: range, device: torch.device) -> float:
    """Mean seconds per call of ``fn(step)`` over ``steps``."""
    sync(device)
    t0 = time.perf_counter()
    for s in steps:
        fn(s)
    sync(device)
    return (time.perf_counter() - t0) / len(steps)


def text(kind: str, rows: int, length: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "random":
        return torch.randint(0, vocab, (rows, length), generator=gen)
    period = torch.randint(0, vocab, (rows, 7), generator=gen)  # a 7-token loop, repeated
    return period.repeat(1, length // 7 + 1)[:, :length]


def run(kind: str, args: argparse.Namespace, device: torch.device) -> dict[str, float]:
    gen = torch.Generator().manual_seed(0)
    start = args.window + 1  # context already fills the window: the steady state of a long decode
    total = start + args.steps * args.rounds
    ids = text(kind, args.batch, args.prompt + total, args.vocab, gen).to(device)
    # fresh logits every call: each call (of any variant) takes the next tensor of a ~128 MB pool, so
    # no call finds its logits in cache, nor the ones another variant just touched
    pool = [torch.randn(args.batch, args.vocab, generator=gen).to(device)
            for _ in range(max(2, (128 << 20) // (4 * args.batch * args.vocab)))]
    calls = itertools.count()
    scores = pool[0]
    x = torch.rand(args.batch, args.vocab, generator=gen).to(device)
    kw = dict(window=args.window, buffer=args.buffer, prompt_length=args.prompt)
    proc = LZPenaltyLogitsProcessor(args.alpha, **kw)
    proc_copy = LZPenaltyLogitsProcessor(args.alpha, inplace=False, **kw)
    proc_incremental = LZPenaltyLogitsProcessor(args.alpha, incremental=True, **kw)

    def fresh(step: int) -> torch.Tensor:
        return pool[next(calls) % len(pool)]

    def view(step: int) -> torch.Tensor:
        return ids[:, : args.prompt + start + step]

    def dense(step: int) -> torch.Tensor:
        pen = lz_penalty(view(step)[:, args.prompt:], args.vocab, args.window, args.buffer)
        return fresh(step) - args.alpha * pen

    fns = {
        "sub_": lambda s: fresh(s).sub_(x),
        "sub": lambda s: fresh(s) - x,
        "processor": lambda s: proc(view(s), fresh(s)),
        "copy": lambda s: proc_copy(view(s), fresh(s)),
        "increm": lambda s: proc_incremental(view(s), fresh(s)),
        "dense": dense,
    }
    check = proc_copy(view(0), scores)
    torch.testing.assert_close(check, dense(0))
    torch.testing.assert_close(proc(view(0), scores.clone()), check)
    for fn in fns.values():  # warm-up
        time_steps(fn, range(3), device)
    # Alternate step by step (blocks on cuda, where timing needs a sync) so that load changes on a
    # shared machine hit the compared variants alike; report medians. By default each variant is
    # alternated with the yardstick alone (its ratio is to the sub_ timed beside it): interleaving
    # every variant would charge "dense"'s [batch, V] temporaries, which evict the caches and TLB
    # entries the processor's latency-bound gather needs, to the processor (2.1x instead of 1.1x
    # at 2 threads, quiet machine). --interleave all reproduces that design.
    block = 1 if device.type == "cpu" else args.steps
    groups = [list(fns)] if args.interleave == "all" else [["sub_", name] for name in fns if name != "sub_"]
    result, yardstick = {}, {}
    for group in groups:
        times: dict[str, list[float]] = {k: [] for k in group}
        for r in range(args.steps * args.rounds // block):
            steps = range(r * block, (r + 1) * block)
            for name in group:
                times[name].append(time_steps(fns[name], steps, device))
        for name in group:
            result[name] = statistics.median(times[name])
            yardstick[name] = statistics.median(times["sub_"])
    result["sub_"] = statistics.median(yardstick.values())
    result["yardstick"] = yardstick  # the sub_ each variant was timed beside

    def direct(step: int) -> torch.Tensor:
        return direct_penalty(view(step)[:, args.prompt:], args.direct_vocab, args.window, args.buffer, args.chunk)

    # its work is linear in V, so a run at a smaller V is scaled up to the full V
    result["direct"] = time_steps(direct, range(args.direct_steps), device) * args.vocab / args.direct_vocab
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--buffer", type=int, default=32)
    ap.add_argument("--alpha", type=float, default=0.15)
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens (kept out of the window)")
    ap.add_argument("--steps", type=int, default=None, help="steps per round (default 50 cpu, 200 cuda)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds (cuda: one timed block per variant each)")
    ap.add_argument("--direct-vocab", type=int, default=None,
                    help="V actually run by the direct [batch,V,W] formulation (default: V on cuda, 16384 on cpu); "
                         "its time is scaled to the full V")
    ap.add_argument("--direct-steps", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=4096, help="V-chunk of the direct formulation (bounds memory)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--interleave", choices=("pairs", "all"), default="pairs",
                    help="pairs: each variant alternated with sub_ alone (default); all: every variant in one rotation")
    args = ap.parse_args()
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.steps = args.steps or (200 if device.type == "cuda" else 50)
    args.direct_vocab = args.direct_vocab or (args.vocab if device.type == "cuda" else 16384)
    print(f"device={device} torch={torch.__version__} threads={torch.get_num_threads()} V={args.vocab} "
          f"batch={args.batch} W={args.window} B={args.buffer} alpha={args.alpha}; "
          f"{args.rounds} rounds of {args.steps} steps; direct formulation: V={args.direct_vocab} "
          f"in chunks of {args.chunk}, {args.direct_steps} steps, time scaled to V={args.vocab}")
    print(f"{'text':<11}{'sub_ us':>9}{'sub us':>9}{'proc us':>9}{'ratio':>7}{'/sub':>6}{'copy':>9}{'ratio':>7}{'increm':>9}{'ratio':>7}"
          f"{'dense us':>10}{'ratio':>7}{'direct us':>11}{'speed-up':>10}")
    for kind in ("random", "repetitive"):
        r = run(kind, args, device)
        beside = r.pop("yardstick")
        us = {k: v * 1e6 for k, v in r.items()}
        base = us["sub_"]
        ratio = {k: r[k] / beside[k] for k in beside}  # each to the sub_ timed beside it
        print(f"{kind:<11}{base:9.1f}{us['sub']:9.1f}{us['processor']:9.1f}{ratio['processor']:7.2f}"
              f"{us['processor'] / us['sub']:6.2f}"
              f"{us['copy']:9.1f}{ratio['copy']:7.2f}{us['increm']:9.1f}{ratio['increm']:7.2f}"
              f"{us['dense']:10.1f}{ratio['dense']:7.2f}"
              f"{us['direct']:11.0f}{us['direct'] / us['processor']:9.0f}x")
    print("ratio = variant / the sub_ timed beside it (goal for the processor: <= 2); sub_ us = their median; "
          "/sub = processor / out-of-place sub; "
          "speed-up = direct / processor")


if __name__ == "__main__":
    main()
