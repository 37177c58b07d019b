"""Host time per decode step outside the model's forward, against the batch size.

    python benchmarks/host_overhead.py                      # batch 1, 16, 64; 1 thread
    python benchmarks/host_overhead.py --batches 1 8 --repeats 3

A micro Llama (1 layer, 16 wide, V = 4096) makes the forward cheap, so what remains of a step is
the driver's planning, proposals and bookkeeping: the host work a GPU would wait on. Greedy,
32-token prompts, 64 new tokens, for NTP (``rpt_iters=0``) and RPT (``k=1, w=2, eta=0.9``) through
:func:`rpt.sampling.generate`, beside Hugging Face ``generate`` (its total per step: its own host
work and its forward). The forward's time is taken by hooks on the model (entry to exit of every
call), so host = total - forward; a step is one model call of the decode. Times are this thread's
CPU time (``time.thread_time``; torch runs 1 thread), so other jobs on a shared machine do not
count, unless ``--wall``. Prints per batch size:
host us/step of NTP and RPT, our NTP total us/step, HF's total us/step, and the ratios of the goals
(host at batch 64 <= 2.5x batch 1; our NTP total <= HF's).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rpt.model import RPTForCausalLM
from rpt.sampling.config import SamplingConfig
from rpt.sampling.decode.generate import generate

MICRO = dict(vocab_size=4096, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=2, max_position_embeddings=512)


def micro_model() -> RPTForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(**MICRO)
    cfg._attn_implementation = "sdpa"
    model = RPTForCausalLM.from_base(LlamaForCausalLM(cfg).eval(), window=2)
    with torch.no_grad():
        model.offset_embedding.weight.normal_(0, cfg.initializer_range)
    return model.eval()


CLOCK = time.thread_time


class ForwardClock:
    """Seconds spent inside ``module``'s forward (hooks at entry and exit), and the number of calls."""

    def __init__(self, module: torch.nn.Module):
        self.seconds, self.calls, self._t0 = 0.0, 0, 0.0
        self._hooks = []
        self._hooks = [module.register_forward_pre_hook(self._enter), module.register_forward_hook(self._exit)]

    def _enter(self, *_):
        self._t0 = CLOCK()

    def _exit(self, *_):
        self.seconds += CLOCK() - self._t0
        self.calls += 1

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()

    def reset(self) -> None:
        self.seconds, self.calls = 0.0, 0


def per_step(fn, clock: ForwardClock) -> tuple[float, float]:
    """``(total, forward)`` microseconds per model call of one run of ``fn``."""
    clock.reset()
    t0 = CLOCK()
    fn()
    total = CLOCK() - t0
    return 1e6 * total / clock.calls, 1e6 * clock.seconds / clock.calls


def measure(model: RPTForCausalLM, batch: int, args) -> dict[str, float]:
    prompt = torch.randint(0, MICRO["vocab_size"], (batch, args.prompt_tokens),
                           generator=torch.Generator().manual_seed(batch))
    sampling = dict(temperature=args.temperature, seed=0)
    configs = {"ntp": SamplingConfig(max_new_tokens=args.new_tokens, eos_token_id=[], **sampling),
               "rpt": SamplingConfig(max_new_tokens=args.new_tokens, rpt_iters=1, rpt_window=2, confidence=0.9,
                                     eos_token_id=[], **sampling)}
    hf_sampling = dict(do_sample=True, temperature=args.temperature, top_k=0) if args.temperature else dict(do_sample=False)
    clock = ForwardClock(model.lm)  # the base model: both decoders' calls, and HF's, pass through it
    runs = {
        "ntp": lambda: generate(model, prompt, configs["ntp"]),
        "rpt": lambda: generate(model, prompt, configs["rpt"]),
        "hf": lambda: model.lm.generate(prompt, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                        pad_token_id=0, **hf_sampling),
    }
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for fn in runs.values():  # warm-up
        fn()
    for _ in range(args.repeats):  # alternated, so a busy machine slows each alike
        for name, fn in runs.items():
            samples[name].append(per_step(fn, clock))
    clock.remove()
    stats = runs["rpt"]().stats
    # how often a step holds an event the greedy flat step hands to the per-row driver (an accepted correction)
    out = {"rpt_calls_per_token": stats["forward_passes"] * batch / stats["new_tokens"],
           "rpt_corrections_per_token": stats["corrections"] / stats["new_tokens"]}
    for name, pairs in samples.items():
        out[f"{name}_total"] = statistics.median(t for t, _ in pairs)
        out[f"{name}_host"] = statistics.median(t - f for t, f in pairs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="0: greedy (default); > 0: sampled NTP and RPT (seed 0), and HF sampling (top_k=0)")
    ap.add_argument("--wall", action="store_true", help="wall-clock time instead of this thread's CPU time")
    args = ap.parse_args()
    global CLOCK
    if args.wall:
        CLOCK = time.perf_counter
    torch.set_num_threads(args.threads)
    model = micro_model()
    rows = {b: measure(model, b, args) for b in args.batches}
    mode = f"temperature {args.temperature}" if args.temperature else "greedy"
    print(f"micro Llama (1 layer, 16 wide, V=4096), {mode}, prompt {args.prompt_tokens}, {args.new_tokens} new tokens, "
          f"{args.threads} thread(s), median of {args.repeats} alternated runs; us per model call "
          f"({'wall clock' if args.wall else 'thread CPU time'})")
    print(f"{'batch':>5} {'NTP host':>9} {'RPT host':>9} {'NTP total':>10} {'HF total':>9} {'HF host':>8} "
          f"{'RPT calls/tok':>14} {'corr/tok':>9}")
    for b, r in rows.items():
        print(f"{b:>5} {r['ntp_host']:9.0f} {r['rpt_host']:9.0f} {r['ntp_total']:10.0f} {r['hf_total']:9.0f} "
              f"{r['hf_host']:8.0f} {r['rpt_calls_per_token']:14.3f} {r['rpt_corrections_per_token']:9.4f}")
    first, last = rows[min(rows)], rows[max(rows)]
    print(f"host growth batch {max(rows)} / batch {min(rows)}: NTP {last['ntp_host'] / first['ntp_host']:.2f}, "
          f"RPT {last['rpt_host'] / first['rpt_host']:.2f} (goal <= 2.5)")
    print(f"NTP total / HF total at batch {max(rows)}: {last['ntp_total'] / last['hf_total']:.2f} (goal <= 1)")


if __name__ == "__main__":
    main()
