"""Training throughput of ``objective=rpt`` against ``objective=ntp``, alternated in one process.

    python benchmarks/train_overhead.py [--steps 12 --rounds 5 --device cpu --precision fp32 --attn sdpa]
                                        [--compile] [--optimizer auto|foreach|fused]
                                        [--batch N | --batch auto --global-batch 32] [--profile 1]

Same model, same packed batches, same optimizer; the two objectives take turns in blocks of
``--steps`` optimizer steps so machine load affects both alike. Prints tokens/s of each and the
ratio rpt / ntp (the goal is >= 0.98); on a GPU also the MFU estimate of each and the peak memory.
``--compile`` compiles each transformer block as ``compile: true`` does (the first warm-up block
pays the compilation); ``--optimizer`` overrides the AdamW kernel ``build_optimizer`` picks (fused
where torch has one). With ``--precision bf16`` it also prints the share of the step's matrix-product
FLOPs that ran in float32 (rpt.training.measure.gemm_census; 0 means every product can use the tensor cores).
``--batch auto`` takes the micro-batch ``micro_batch_size: auto`` would (rpt.training.micro_batch: searched on
CUDA among the divisors of ``--global-batch``, estimated on the CPU) and says how; ``--profile N``
profiles N more steps of each objective and prints where their time goes (rpt.training.measure.step_profile: the top
kernels, and the shares of matrix products, attention, the loss head, the optimizer and the rest).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rpt.model import RPTForCausalLM
from rpt.training.compiled_blocks import compile_blocks
from rpt.training.config import TrainConfig
from rpt.training.measure.gemm_census import GemmCensus
from rpt.training.measure.metrics import device_peak_flops, flops_per_token
from rpt.training.measure.step_profile import profile_steps
from rpt.training.micro_batch import choose as choose_micro_batch
from rpt.training.setup import build_optimizer
from rpt.training.step import forward, make_batch, trial_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6, help="optimizer steps per block")
    ap.add_argument("--rounds", type=int, default=5, help="blocks per objective")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", default="16", help="micro-batch: a number, or auto (the largest that fits)")
    ap.add_argument("--global-batch", type=int, default=32, help="with --batch auto: the sequences it divides")
    ap.add_argument("--profile", type=int, default=0, help="profile this many steps of each objective")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--attn", default="sdpa", help="attn_implementation: sdpa | eager | flash_attention_2")
    ap.add_argument("--compile", action="store_true", help="torch.compile each transformer block (compile: true)")
    ap.add_argument("--optimizer", default="auto", choices=["auto", "foreach", "fused"],
                    help="AdamW kernel (auto: what training uses, fused where torch has one)")
    args = ap.parse_args()

    torch.manual_seed(0)
    cfg_model = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3,
                            num_hidden_layers=args.layers, num_attention_heads=max(1, args.hidden // 64),
                            max_position_embeddings=args.seq_len + 1)
    cfg_model._attn_implementation = args.attn
    model = RPTForCausalLM.from_base(LlamaForCausalLM(cfg_model), window=3).to(args.device).train()
    device = torch.device(args.device)
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")
    if args.batch == "auto":
        # the run's own choice: the bare model's trial steps (eager), before anything is compiled
        cfg = TrainConfig(model="bench", data="bench", objective="rpt", seq_len=args.seq_len, window=3, s=0.5, q=0.02,
                          global_batch_size=args.global_batch, micro_batch_size="auto", precision=args.precision)
        split = choose_micro_batch(cfg, 1, model, device, False, lambda micro: trial_step(
            model, cfg, micro, device, lambda: torch.autocast(device.type, torch.bfloat16, enabled=args.precision == "bf16")),
            lambda micro: micro)
        print(split.line())
        args.batch = split.micro
    args.batch = int(args.batch)
    configs = {
        name: TrainConfig(model="bench", data="bench", objective=name, seq_len=args.seq_len, window=3, s=0.5, q=0.02,
                          micro_batch_size=args.batch, lr=1e-4)
        for name in ("ntp", "rpt")
    }
    fpt = flops_per_token(model, args.seq_len)  # counted on the bare model
    if args.compile:
        compile_blocks(model)
    optimizer = build_optimizer(model, configs["rpt"])
    if args.optimizer != "auto":
        groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in optimizer.param_groups]
        optimizer = torch.optim.AdamW(groups, lr=1e-4, **{args.optimizer: True})
    data = torch.randint(0, args.vocab, (args.batch * 8, args.seq_len + 1))

    def float32_share() -> float:
        """The float32 share of one rpt step's matrix-product FLOPs (its update is not applied)."""
        batch = make_batch(configs["rpt"], data[: args.batch], 1, 0).to(args.device)
        with GemmCensus() as census, torch.compiler.set_stance("force_eager"):  # the census sees eager ops
            with autocast:
                out = forward(model, batch)
            out.loss.backward()
        optimizer.zero_grad(set_to_none=True)
        return census.share(torch.float32)

    def one_step(name: str, step: int) -> None:
        rows = data[(step % 8) * args.batch : (step % 8 + 1) * args.batch]
        batch = make_batch(configs[name], rows, step, 0).to(args.device)
        with autocast:
            out = forward(model, batch)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def block(name: str, round_index: int) -> float:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(args.steps):
            one_step(name, round_index * args.steps + i + 1)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return args.steps * args.batch * args.seq_len / (time.perf_counter() - t0)

    block("ntp", 0), block("rpt", 0)  # warm-up
    rates: dict[str, list[float]] = {"ntp": [], "rpt": []}
    for r in range(args.rounds):
        order = ("ntp", "rpt") if r % 2 == 0 else ("rpt", "ntp")
        for name in order:
            rates[name].append(block(name, r + 1))
    ntp, rpt = statistics.median(rates["ntp"]), statistics.median(rates["rpt"])
    params = sum(p.numel() for p in model.parameters()) / 1e6
    kernel = "fused" if optimizer.defaults.get("fused") else "foreach" if optimizer.defaults.get("foreach") else "for-loop"
    print(f"{params:.1f}M-param Llama, batch {args.batch} x {args.seq_len}, {args.device} {args.precision}, "
          f"{args.rounds} alternating blocks of {args.steps} steps (median); blocks "
          f"{'compiled' if args.compile else 'eager'}, AdamW {kernel}")
    print(f"objective=ntp: {ntp:10.0f} tokens/s")
    print(f"objective=rpt: {rpt:10.0f} tokens/s   (w=3, s=0.5, q=0.02)")
    print(f"rpt / ntp = {rpt / ntp:.3f}")
    peak = device_peak_flops(torch.device(args.device), args.precision)
    if peak:
        print(f"MFU (nanoGPT estimate, {peak / 1e12:.0f} TFLOP/s peak): ntp {ntp * fpt / peak:.3f}, rpt {rpt * fpt / peak:.3f}")
    if args.device.startswith("cuda"):
        print(f"peak memory allocated: {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    if args.precision == "bf16":
        print(f"float32 share of the step's matrix-product FLOPs: {100 * float32_share():.2f}%")
    for name in ("ntp", "rpt") if args.profile else ():
        steps = iter(range(10_000, 20_000))
        profile = profile_steps(lambda _name=name, _steps=steps: one_step(_name, next(_steps)), args.profile, device)
        print(f"objective={name}: {profile.table()}")


if __name__ == "__main__":
    main()
