"""``generate(compile=True)`` over batches of many prompt widths: same tokens as eager, no fallback.

    python benchmarks/compile_widths.py --threads 2
    python benchmarks/compile_widths.py --threads 2 --penalties   # + LZ and repetition penalties

The 4-layer benchmark model (``benchmarks/rpt_decode.py``), 12 batches whose prompt widths all
differ, for ``rpt_iters`` 0 and 1: each batch decoded eagerly and compiled (inductor), alternated.
The first call of a new shape pays its compilation (one graph per capacity bucket and query
bucket), then each batch is timed ``--repeats`` times eager and compiled, alternated; the report is
the speed ratio compiled / eager (median time) over the last six batches, whether every batch gave
the eager tokens, the graphs dynamo compiled and whether it printed ``recompile_limit`` (past which
it would silently run the step eagerly). ``--penalties`` adds the LZ penalty (alpha 0.15, W 64,
B 16) and a repetition penalty of 1.2: with ``rpt_iters=0`` they run inside the compiled step
(:class:`rpt.sampling.decode.ntp_path.CompiledNTPStep`), eagerly they are a run of small operations per step.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

import torch

from rpt.sampling.config import SamplingConfig
from rpt.sampling.decode.generate import generate

try:
    from rpt_decode import build
except ImportError:  # run from the repository root as a module path
    from benchmarks.rpt_decode import build


class Messages(logging.Handler):
    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def emit(self, record):
        self.seen.append(record.getMessage())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rpt-iters", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--penalties", action="store_true", help="add the LZ (alpha 0.15) and repetition (1.2) penalties")
    ap.add_argument("--widths", type=int, nargs="+", default=[5, 9, 13, 17, 21, 26, 31, 37, 44, 52, 61, 70])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from torch._dynamo.utils import counters

    messages = Messages()
    logging.getLogger("torch._dynamo").addHandler(messages)
    model = build("tiny", "cpu", torch.float32)
    vocab = model.config.vocab_size
    penalties = dict(lz_penalty=0.15, lz_window=64, lz_buffer=16, repetition_penalty=1.2) if args.penalties else {}
    print(f"4-layer benchmark model, batch {args.batch}, {args.new_tokens} new tokens, widths {args.widths}, "
          f"{torch.get_num_threads()} threads, penalties {penalties or 'none'}")
    for k in args.rpt_iters:
        cfg = SamplingConfig(max_new_tokens=args.new_tokens, rpt_iters=k, rpt_window=2, confidence=0.9,
                             eos_token_id=[], **penalties)
        torch._dynamo.reset()
        counters.clear()
        same, rates = True, []
        for width in args.widths:
            ids = torch.randint(0, vocab, (args.batch, width), generator=torch.Generator().manual_seed(width))
            first = time.perf_counter()
            compiled = generate(model, ids, cfg, compile=True)  # the first batches compile here
            first = time.perf_counter() - first
            times = {False: [], True: []}
            for _ in range(args.repeats):  # alternated: a busy machine slows both alike
                for c in (False, True):
                    t0 = time.perf_counter()
                    out = generate(model, ids, cfg, compile=c)
                    times[c].append(time.perf_counter() - t0)
                    same &= torch.equal(out.sequences, compiled.sequences)
            eager_s, compiled_s = statistics.median(times[False]), statistics.median(times[True])
            rates.append(eager_s / compiled_s)
            print(f"  rpt_iters={k} width {width:3d}: first compiled call {first:7.2f} s; median eager {eager_s:.3f} s, "
                  f"compiled {compiled_s:.3f} s", flush=True)
        last = sorted(rates[-6:])
        print(f"rpt_iters={k}: compiled / eager speed over the last six batches: median {(last[2] + last[3]) / 2:.2f}x "
              f"(min {last[0]:.2f}x, goal >= 1.1); same tokens: {same}; graphs: {counters['stats']['unique_graphs']}; "
              f"recompile_limit messages: {sum('recompile_limit' in m for m in messages.seen)}")


if __name__ == "__main__":
    main()
