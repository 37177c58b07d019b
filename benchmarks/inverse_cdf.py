"""Time of one inverse-CDF draw alone, the two-level draw against one sequential float64 cumsum.

    python benchmarks/inverse_cdf.py                 # [64, 4096] and [8, 128256] float32, 1 thread
    python benchmarks/inverse_cdf.py --shapes 16x4096 --draws 2

Both run in one process on the same softmaxed random logits and uniforms, and the script checks they
draw the same tokens. Prints per shape the median us per call of each and their ratio, twice: calls
alternated one by one (a load spike hits both), and each in a block of calls of its own. The two
differ by the allocator: the float64 temporaries (the sequential draw's copy and cumsum of
``[batch, V]``, the two-level draw's float64 cast inside its chunk sums) are fresh pages, faulted in
again on every call, when glibc hands freed large blocks back to the system, which alternation with
the other draw's differently sized blocks provokes.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rpt.sampling.randomness import _sequential, _two_level, uniforms


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return (time.perf_counter() - start) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["64x4096", "8x128256"], help="BATCHxV, V a multiple of 64")
    parser.add_argument("--draws", type=int, default=1)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    print(f"float32 probs, {args.draws} draw(s), {args.threads} thread(s), median of {args.calls} calls")
    print(f"{'shape':>10} {'alternated: sequential us':>26} {'two-level us':>13} {'ratio':>6}   "
          f"{'blocks: sequential us':>22} {'two-level us':>13} {'ratio':>6}")
    for shape in args.shapes:
        batch, width = (int(x) for x in shape.split("x"))
        if width % 64:
            parser.error(f"--shapes {shape}: V must be a multiple of 64 (else inverse_cdf is the sequential draw)")
        probs = torch.softmax(torch.randn(batch, width, generator=gen) * 3, -1)
        u = uniforms(torch.arange(batch), 7, 0, 0, draws=args.draws)
        same = torch.equal(_sequential(probs, u), _two_level(probs, u))
        old, new = [], []
        for _ in range(args.calls):
            old.append(timed(_sequential, probs, u))
            new.append(timed(_two_level, probs, u))
        a, b = statistics.median(old), statistics.median(new)
        c = statistics.median(timed(_sequential, probs, u) for _ in range(args.calls))
        d = statistics.median(timed(_two_level, probs, u) for _ in range(args.calls))
        print(f"{shape:>10} {a:26.1f} {b:13.1f} {b / a:6.3f}   {c:22.1f} {d:13.1f} {d / c:6.3f}"
              + ("" if same else "  (tokens differ!)"))


if __name__ == "__main__":
    main()
