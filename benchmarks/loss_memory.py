"""Peak memory one forward + backward with labels adds, chunked loss vs plain float32 logits.

    python benchmarks/loss_memory.py [--vocab 128256 --batch 2 --seq 1024 --hidden 64 --device cpu]
    python benchmarks/loss_memory.py --head-only --hidden 2048 --batch 1 --seq 512   # the loss head alone, bf16

Each loss runs in a fresh process (so one's allocations cannot hide the other's): a Llama body
of ``--layers`` x ``--hidden`` with a ``--vocab`` head, batch x seq tokens, fp32. "Adds" is the
peak during forward + backward minus the memory in use just before it (model and inputs built):
on CUDA ``max_memory_allocated``, on a CPU the kernel's peak resident set (VmHWM, reset first).
It includes the gradients (the embedding and head gradients: 2 x vocab x hidden x 4 bytes).
The plain loss is what ``RPTForCausalLM`` computed before: ``cross_entropy(logits.float())``
over the whole batch.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def start_peak(device: str) -> float:
    """Reset the peak-memory counter of ``device``; returns the memory in use now (MB)."""
    import torch

    from rpt.training.measure.metrics import current_memory_mb, reset_cpu_peak

    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated() / 2**20
    assert reset_cpu_peak(), "needs Linux /proc/self/clear_refs"
    return current_memory_mb()


def read_peak(device: str) -> float:
    """The peak memory (MB) since :func:`start_peak`: CUDA's allocated peak, or the CPU's VmHWM."""
    import torch

    from rpt.training.measure.metrics import _proc_status_mb

    if device.startswith("cuda"):
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 2**20
    return _proc_status_mb("VmHWM")


def measure(loss: str, vocab: int, batch: int, seq: int, hidden: int, layers: int, device: str,
            save_grads: str | None = None) -> dict:
    """Run one forward + backward in this process; returns what it added to peak memory (MB).
    ``save_grads``: also write the gradients there (after the measurement) for a comparison."""
    import torch
    import torch.nn.functional as F
    from transformers import LlamaConfig, LlamaForCausalLM

    from rpt.model import RPTForCausalLM
    from rpt.model.objective import make_rpt_batch

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=seq + 1)
    model = RPTForCausalLM.from_base(LlamaForCausalLM(config), window=3).to(device).train()
    rows = torch.randint(0, vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(1))
    b = make_rpt_batch(rows, 3, 0.5, 0.02, generator=torch.Generator().manual_seed(2), num_inputs=seq).to(device)
    before = start_peak(device)
    if loss == "chunked":
        out = model(b.input_ids, position_ids=b.position_ids, offset_ids=b.offset_ids, labels=b.labels, kinds=b.kinds)
        value = out.loss
    else:
        logits = model(b.input_ids, position_ids=b.position_ids, offset_ids=b.offset_ids).logits
        value = F.cross_entropy(logits.float().reshape(-1, vocab), b.labels.reshape(-1))
    value.backward()
    peak = read_peak(device)
    logits_mb = batch * seq * vocab * 4 / 2**20
    if save_grads:
        torch.save({n: p.grad.cpu() for n, p in model.named_parameters() if p.grad is not None}, save_grads)
    return {"loss": loss, "added_mb": peak - before, "float32_logits_mb": logits_mb, "value": float(value.detach())}


def measure_head(vocab: int, tokens: int, hidden: int, device: str, budget_mb: int = 32) -> dict:
    """The tiled loss head alone in bf16 (rpt.model.loss): what its forward + backward add to peak memory,
    against the bound "one float32 head gradient plus one tile of float32 logits". Its weight
    gradient comes back in bf16 (half that float32 gradient), formed slice by slice."""
    import torch

    from rpt.model.loss import linear_cross_entropy, plan_blocks

    g = torch.Generator().manual_seed(0)
    hid = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16).to(device).requires_grad_(True)
    weight = (0.02 * torch.randn(vocab, hidden, generator=g)).to(torch.bfloat16).to(device).requires_grad_(True)
    labels = torch.randint(0, vocab, (tokens,), generator=g).to(device)
    blocks = plan_blocks(tokens, vocab, budget_mb << 20)
    before = start_peak(device)
    linear_cross_entropy(hid, weight, None, labels, blocks).sum().backward()
    peak = read_peak(device)
    bound = (4 * vocab * hidden + 4 * blocks.tokens * blocks.vocab) / 2**20
    return {"added_mb": peak - before, "bound_mb": bound, "blocks": list(blocks)}


def run_in_subprocess(loss: str, args, save_grads: str | None = None) -> dict:
    code = (f"import json, benchmarks.loss_memory as m; print(json.dumps(m.measure({loss!r}, {args.vocab}, {args.batch}, "
            f"{args.seq}, {args.hidden}, {args.layers}, {args.device!r}, {save_grads!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--only", choices=["chunked", "plain"], default=None)
    ap.add_argument("--head-only", action="store_true", help="the bf16 loss head alone, against its memory bound")
    args = ap.parse_args()
    if args.head_only:
        r = measure_head(args.vocab, args.batch * args.seq, args.hidden, args.device)
        print(f"bf16 loss head, V={args.vocab}, H={args.hidden}, {args.batch * args.seq} tokens, tiles {r['blocks']}: "
              f"adds {r['added_mb']:.0f} MB to peak memory (bound: one float32 head gradient + one tile of logits "
              f"= {r['bound_mb']:.0f} MB)")
        return
    import os
    import tempfile

    import torch

    tmp = tempfile.mkdtemp()
    results = [run_in_subprocess(loss, args, os.path.join(tmp, f"{loss}.pt"))
               for loss in ("chunked", "plain") if args.only in (None, loss)]
    print(f"V={args.vocab}, {args.batch} x {args.seq} tokens, Llama body {args.layers} x {args.hidden}, {args.device} fp32; "
          f"float32 logits would be {results[0]['float32_logits_mb']:.0f} MB")
    for r in results:
        print(f"{r['loss']:>8} loss: adds {r['added_mb']:7.0f} MB to peak memory (loss {r['value']:.6f})")
    if len(results) == 2:
        print(f"chunked / plain = {results[0]['added_mb'] / results[1]['added_mb']:.3f}")
        ours, ref = (torch.load(os.path.join(tmp, f"{n}.pt")) for n in ("chunked", "plain"))
        worst = max(float((ours[k] - ref[k]).abs().max() / ref[k].abs().max().clamp(min=1e-30)) for k in ref)
        rel_loss = abs(results[0]["value"] - results[1]["value"]) / abs(results[1]["value"])
        print(f"loss relative difference {rel_loss:.2e}; largest gradient difference / largest gradient {worst:.2e}")
    for n in os.listdir(tmp):
        os.remove(os.path.join(tmp, n))
    os.rmdir(tmp)


if __name__ == "__main__":
    main()
