"""Cost of building the permuted-window batch next to one forward pass, in one process.

    python benchmarks/objective_overhead.py [--batch 8 --seq 4096 --device cpu]

Prints the median time of ``make_rpt_batch`` (w=3, s=0.5, q=0.02, the paper's recipe) and of a
forward pass of a small Llama on the same batch, and their ratio. Both are timed alternately so
the machine's load affects them alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rpt.model import RPTForCausalLM
from rpt.model.objective import make_rpt_batch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=args.seq + 1)
    model = RPTForCausalLM.from_base(LlamaForCausalLM(cfg), window=3).to(args.device).eval()
    tokens = torch.randint(0, 4096, (args.batch, args.seq + 1), device=args.device)
    gen = torch.Generator(device=args.device).manual_seed(0)

    def build():
        return make_rpt_batch(tokens, window=3, s=0.5, q=0.02, generator=gen, num_inputs=args.seq)

    def forward(b):
        with torch.no_grad():
            model(b.input_ids, position_ids=b.position_ids, offset_ids=b.offset_ids, use_cache=False)

    def timed(fn, *a):
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn(*a)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - t0, out

    batch = build()
    forward(batch)  # warm-up
    t_obj, t_fwd = [], []
    for _ in range(args.repeats):
        dt, batch = timed(build)
        t_obj.append(dt)
        dt, _ = timed(forward, batch)
        t_fwd.append(dt)
    obj, fwd = statistics.median(t_obj), statistics.median(t_fwd)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"batch {args.batch} x {args.seq} tokens on {args.device}, model {params:.1f}M params (4 layers, 256 wide)")
    print(f"make_rpt_batch (w=3, s=0.5, q=0.02): {obj * 1e3:8.2f} ms")
    print(f"one forward pass (no grad):           {fwd * 1e3:8.2f} ms")
    print(f"objective / forward = {obj / fwd:.4f}")


if __name__ == "__main__":
    main()
