"""Decode speed of RPT sampling against plain NTP sampling, alternated in one process.

    python benchmarks/rpt_decode.py                     # CPU: 4 layers, 256 wide, 4096 vocab
    python benchmarks/rpt_decode.py --device cuda --dtype bfloat16 --model-size 1b

A random Llama wrapped with a random offset table, a 64-token prompt, greedy NTP. Runs
``rpt_iters=1, w=2, confidence=0.9`` and ``rpt_iters=0`` (plain NTP through the same decoder)
alternately ``--repeats`` times and prints the median tokens/s of each, their ratio (goal >= 0.8)
and model calls per new token (goal <= 1.1), plus Hugging Face ``generate`` (greedy, same base
model) for scale. On CUDA it also prints the achieved memory bandwidth: bytes of weights read per
model call (every parameter except the input embedding table, of which a call reads a few rows)
times calls per second.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rpt.model import RPTForCausalLM
from rpt.sampling.config import SamplingConfig
from rpt.sampling.rpt import generate

SIZES = {
    # the CPU model
    "tiny": dict(vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=4),
    # Llama-3.2-1B shapes (tied embeddings): about 1.24B parameters
    "1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True),
}


def build(size: str, device: str, dtype: torch.dtype, window: int = 2) -> RPTForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(max_position_embeddings=4096, **SIZES[size])
    cfg._attn_implementation = "sdpa"
    with torch.device(device):
        base = LlamaForCausalLM(cfg).to(dtype).eval()
    model = RPTForCausalLM.from_base(base, window=window)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        table = torch.randn(model.offset_embedding.weight.shape, generator=g) * cfg.initializer_range
        model.offset_embedding.weight.copy_(table.to(model.offset_embedding.weight))
    return model.eval()


def weight_bytes(model: RPTForCausalLM) -> int:
    """Bytes one decode call streams from memory: every weight but the input embedding table."""
    emb = model.lm.get_input_embeddings().weight
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if model.lm.get_output_embeddings().weight is not emb:  # untied: the input table is only gathered
        total -= emb.numel() * emb.element_size()
    return total


def timed(fn, device: str):
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--model-size", default="tiny", choices=sorted(SIZES))
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0,
                    help="torch CPU threads (0: 1 on CPU, where a batch-1 decode of this size only loses to "
                         "thread start-up and to other jobs on a shared machine; torch's default elsewhere)")
    ap.add_argument("--no-hf", action="store_true", help="skip the Hugging Face generate reference")
    args = ap.parse_args()
    if args.threads or args.device == "cpu":
        torch.set_num_threads(args.threads or 1)
    dtype = getattr(torch, args.dtype)
    model = build(args.model_size, args.device, dtype)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (args.batch, args.prompt_tokens), generator=torch.Generator().manual_seed(2))
    prompt = prompt.to(args.device)
    configs = {
        "ntp (rpt_iters=0)": SamplingConfig(max_new_tokens=args.new_tokens, rpt_iters=0),
        "rpt (k=1, w=2, eta=0.9)": SamplingConfig(max_new_tokens=args.new_tokens, rpt_iters=1, rpt_window=2,
                                                  confidence=0.9),
    }

    def hf():
        return model.lm.generate(prompt, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                 do_sample=False, pad_token_id=0)

    runs = {name: [] for name in configs}
    stats = {}
    hf_rates = []
    for cfg in configs.values():  # warm-up
        generate(model, prompt, cfg)
    for _ in range(args.repeats):
        for name, cfg in configs.items():
            dt, out = timed(lambda cfg=cfg: generate(model, prompt, cfg), args.device)
            runs[name].append(out.stats["new_tokens"] / dt)
            stats[name] = out.stats
        if not args.no_hf:
            dt, out = timed(hf, args.device)
            hf_rates.append((out.shape[1] - args.prompt_tokens) * args.batch / dt)

    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {args.model_size} ({n_params / 1e6:.1f}M params, {args.dtype}) on {args.device}, "
          f"batch {args.batch}, prompt {args.prompt_tokens}, {args.new_tokens} new tokens, "
          f"median of {args.repeats} alternated runs, torch threads {torch.get_num_threads()}")
    rates = {}
    for name in configs:
        rates[name] = statistics.median(runs[name])
        s = stats[name]
        line = (f"{name:<26} {rates[name]:9.1f} tokens/s   calls/new token {s['calls_per_token']:.3f}   "
                f"corrections {s['corrections']}")
        if args.device.startswith("cuda"):
            calls_per_s = rates[name] * s["calls_per_token"]
            line += f"   weights bandwidth {weight_bytes(model) * calls_per_s / 1e9:7.1f} GB/s"
        print(line)
    if hf_rates:
        print(f"{'HF generate greedy (NTP)':<26} {statistics.median(hf_rates):9.1f} tokens/s")
    ntp, rpt = rates["ntp (rpt_iters=0)"], rates["rpt (k=1, w=2, eta=0.9)"]
    print(f"ratio rpt/ntp tokens/s: {rpt / ntp:.3f} (goal >= 0.8); "
          f"rpt calls per new token: {stats['rpt (k=1, w=2, eta=0.9)']['calls_per_token']:.3f} (goal <= 1.1)")


if __name__ == "__main__":
    main()
