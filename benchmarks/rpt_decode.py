"""Decode speed of RPT sampling against plain NTP sampling and Hugging Face ``generate``, alternated
in one process.

    python benchmarks/rpt_decode.py --threads 2                 # CPU: 4 layers, 256 wide, 4096 vocab
    python benchmarks/rpt_decode.py --threads 2 --batch 8
    python benchmarks/rpt_decode.py --threads 2 --compile       # also the torch.compile'd decoder
    python benchmarks/rpt_decode.py --device cuda --dtype bfloat16 --model-size 1b --compile --hf-static
    python benchmarks/rpt_decode.py --device cuda --dtype bfloat16 --model-size 1b --compiled-only \
        --batch 1 4 16 --new-tokens 64 --repeats 1 --corrections 0.05   # the quick GPU rows

A random Llama wrapped with a random offset table, a 64-token prompt, greedy NTP. Runs
``rpt_iters=1, w=2, confidence=0.9`` and ``rpt_iters=0`` (plain NTP through the same decoder) and
Hugging Face ``generate`` (greedy, same base model, its default dynamic cache, or with
``--hf-static`` its static cache, which HF compiles on CUDA) alternately
``--repeats`` times and prints the median tokens/s of each, model calls per new token of a row,
and the goals: NTP >= 0.9x HF ``generate``; RPT >= 0.9 of the machine's ceiling (below);
<= 1.1 model calls per new token. On CUDA it also prints the achieved memory bandwidth: bytes of
weights read per model call (every parameter except the input embedding table, of which a call
reads a few rows) times calls per second. Each decoder's first call is timed apart (``first call``:
for a compiled decoder, its compilation and capture), and a compiled decoder whose compilation
failed and fell back to eager (``rpt.decode_forward.compile_guard``) is reported as such (exit status 1), never as
a compiled rate. ``--corrections P`` adds RPT rows at a confidence where about a fraction P of the
sweeps accept a proposal (measured on the bare fused calls), so that corrections -- and the
compiled steps queued past them -- are in the timing.

The ceiling: the bare model calls the two samplers make on their common path, with no sampling
logic, through the same query primitive (:class:`rpt.decode_forward.queries.ModelQueries`): one 1-row call per
token (NTP) against one 2-row call ``[x_n | PTP query for x_{n-1}]`` with its mask and offsets
(RPT, w=2). Their ratio measures what a second query row costs the hardware (near nothing when a
call is memory-bound, as on a GPU; a second row of every matmul where the CPU BLAS is
compute-bound at two rows), which bounds the decoders' RPT / NTP ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rpt.cli.devices import DTYPES
from rpt.decode_forward.queries import ModelQueries, Visibility
from rpt.model import RPTForCausalLM
from rpt.sampling.config import SamplingConfig
from rpt.sampling.decode.generate import generate

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


def bare_calls(model: RPTForCausalLM, prompt: torch.Tensor, new_tokens: int, fused: bool,
               ptp_top: list[float] | None = None) -> tuple[float, torch.Tensor]:
    """Tokens/s of the model calls alone of one greedy NTP decode, and its ``[batch, new_tokens]`` tokens.

    The calls are the decoders' own (:class:`rpt.decode_forward.queries.ModelQueries` on a position-addressed
    cache); ``fused`` feeds each as the RPT decoder's common path does: x_n twice, as the NTP
    query (column n) and as the PTP query for x_{n-1} (offset row 1, a scratch column past n, seeing
    only x_{<n-1}); only the NTP query picks the next token.
    """
    device = prompt.device
    batch, length = prompt.shape
    queries = ModelQueries(model, length + new_tokens + 2)
    cols = torch.arange(length, device=device)
    logits = queries(prompt, cols.expand(batch, -1), cols, Visibility(cols), kv_len=length, keep=1)
    token = logits[:, -1].argmax(-1, keepdim=True)
    offsets = torch.tensor([0, 1], device=device).expand(batch, 2)
    generated = [token.tolist()]
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(new_tokens):
        n = length  # the column of the token just proposed
        if fused:
            columns = torch.tensor([n, n + 1], device=device)
            vis = Visibility(torch.tensor([n, n - 2], device=device))
            logits = queries(token.expand(batch, 2), columns.expand(batch, 2), columns, vis, kv_len=n + 2,
                             offsets=offsets, keep=2)
        else:
            column = torch.tensor([n], device=device)
            logits = queries(token, column.expand(batch, 1), column, Visibility(column), kv_len=n + 1, keep=1,
                             plain=True)
        token = logits[:, 0].argmax(-1, keepdim=True)
        if ptp_top is not None and fused:
            ptp_top += torch.softmax(logits[:, 1].float(), -1).amax(-1).tolist()
        generated.append(token.tolist())  # the decoders bring each call's proposals to the host once
        length += 1
    rate = new_tokens * batch / (time.perf_counter() - start)
    return rate, torch.tensor(generated[:new_tokens], dtype=torch.long).squeeze(-1).T


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=DTYPES)
    ap.add_argument("--model-size", default="tiny", choices=sorted(SIZES))
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--batch", type=int, nargs="+", default=[1], help="batch sizes, one report each (one model)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0,
                    help="torch CPU threads (0: 1 on CPU, where a batch-1 decode of this size only loses to "
                         "thread start-up and to other jobs on a shared machine; torch's default elsewhere)")
    ap.add_argument("--no-hf", action="store_true", help="skip the Hugging Face generate reference")
    ap.add_argument("--hf-static", action="store_true",
                    help="HF generate with cache_implementation='static' (compiled by HF on CUDA)")
    ap.add_argument("--compile", action="store_true", help="also time generate(..., compile=True)")
    ap.add_argument("--compiled-only", action="store_true",
                    help="only the compiled decoders (implies --compile, --no-hf): no eager runs, no bare calls")
    ap.add_argument("--corrections", type=float, default=None, metavar="P",
                    help="also RPT rows at the confidence that about a fraction P of the sweeps accept (the "
                         "(1 - P) quantile of the PTP query's top probability, measured on the bare fused calls)")
    args = ap.parse_args()
    if args.compiled_only:
        args.compile, args.no_hf = True, True
    if args.threads or args.device == "cpu":
        torch.set_num_threads(args.threads or 1)
    dtype = getattr(torch, args.dtype)
    model = build(args.model_size, args.device, dtype)
    vocab = model.config.vocab_size
    failed = 0
    for batch in args.batch:
        prompt = torch.randint(0, vocab, (batch, args.prompt_tokens), generator=torch.Generator().manual_seed(2))
        prompt = prompt.to(args.device)
        failed += report(args, model, batch, *measure(args, model, prompt, decoders(args, model, prompt)))
    return 1 if failed else 0


def decoders(args, model: RPTForCausalLM, prompt: torch.Tensor) -> dict:
    """name -> (config, compile): NTP and RPT (k = 1, w = 2, eta = 0.9), eager and / or compiled, and with
    ``--corrections`` RPT at a confidence where corrections happen."""
    # eos_token_id=[]: every run makes all its tokens (the random config's EOS id is just a token)
    ntp_cfg = SamplingConfig(max_new_tokens=args.new_tokens, rpt_iters=0, eos_token_id=[])
    rpt_cfg = SamplingConfig(max_new_tokens=args.new_tokens, rpt_iters=1, rpt_window=2, confidence=0.9, eos_token_id=[])
    out = {} if args.compiled_only else {NTP: (ntp_cfg, False), RPT: (rpt_cfg, False)}
    if args.compile:
        out.update({NTP_COMPILED: (ntp_cfg, True), RPT_COMPILED: (rpt_cfg, True)})
    if args.corrections is not None:
        top: list[float] = []
        with torch.inference_mode():
            bare_calls(model, prompt, min(args.new_tokens, 64), True, ptp_top=top)
        eta = float(torch.tensor(top).quantile(1 - args.corrections))
        low = SamplingConfig(max_new_tokens=args.new_tokens, rpt_iters=1, rpt_window=2, confidence=eta, eos_token_id=[])
        if not args.compiled_only:
            out[f"rpt eta={eta:.3g}"] = (low, False)
        if args.compile:
            out[f"rpt compiled eta={eta:.3g}"] = (low, True)
    return out


NTP, RPT = "ntp (rpt_iters=0)", "rpt (k=1, w=2, eta=0.9)"
NTP_COMPILED, RPT_COMPILED = "ntp compiled", "rpt compiled"


def measure(args, model: RPTForCausalLM, prompt: torch.Tensor, decoders: dict) -> tuple:
    """Alternate every decoder, HF ``generate`` and the bare calls ``--repeats`` times; the first call of
    each decoder (its compilation, for a compiled one) is timed apart."""

    # --hf-static: HF's static cache, which HF's generate compiles itself where it can (CUDA)
    cache = {"cache_implementation": "static"} if args.hf_static else {}

    def hf():
        return model.lm.generate(prompt, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                 do_sample=False, pad_token_id=0, **cache)

    runs = {name: [] for name in decoders}
    stats, first = {}, {}
    hf_rates = []
    bare = {False: [], True: []}
    for name, (cfg, compiled) in decoders.items():  # warm-up (and compilation)
        first[name], _ = timed(lambda cfg=cfg, c=compiled: generate(model, prompt, cfg, compile=c), args.device)
    if not args.no_hf:
        hf()
    if not args.compiled_only:
        with torch.inference_mode():
            for fused in bare:
                bare_calls(model, prompt, 8, fused)
    for _ in range(args.repeats):
        if not args.compiled_only:
            with torch.inference_mode():
                for fused in bare:
                    bare[fused].append(bare_calls(model, prompt, args.new_tokens, fused)[0])
        for name, (cfg, compiled) in decoders.items():
            dt, out = timed(lambda cfg=cfg, c=compiled: generate(model, prompt, cfg, compile=c), args.device)
            runs[name].append(out.stats["new_tokens"] / dt)
            stats[name] = out.stats
        if not args.no_hf:
            dt, out = timed(hf, args.device)
            hf_rates.append((out.shape[1] - args.prompt_tokens) * prompt.shape[0] / dt)
    return runs, stats, first, hf_rates, bare


def report(args, model, batch: int, runs: dict, stats: dict, first: dict, hf_rates: list, bare: dict) -> int:
    """Print the batch's report; returns how many compiled decoders fell back to eager."""
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {args.model_size} ({n_params / 1e6:.1f}M params, {args.dtype}) on {args.device}, "
          f"batch {batch}, prompt {args.prompt_tokens}, {args.new_tokens} new tokens, "
          f"median of {args.repeats} alternated runs, torch threads {torch.get_num_threads()}, torch {torch.__version__}")
    rates = {name: statistics.median(r) for name, r in runs.items()}
    calls = {name: s["forward_passes"] / (s["new_tokens"] / batch) for name, s in stats.items()}
    fell_back = 0
    for name, rate in rates.items():
        s = stats[name]
        line = (f"{name:<26} {rate:9.1f} tokens/s   calls/new token {calls[name]:.3f}   "
                f"corrections {s['corrections']}   first call {first[name]:.1f} s")
        if s.get("steps_past_events"):
            line += f"   steps queued past events {s['steps_past_events']}"
        if args.device.startswith("cuda"):
            line += f"   weights bandwidth {weight_bytes(model) * rate / batch * calls[name] / 1e9:7.1f} GB/s"
        if s.get("compile_fallback"):
            fell_back += 1
            line += f"   FELL BACK TO EAGER ({s['compile_fallback']})"
        print(line)
    if hf_rates:
        hf_rate = statistics.median(hf_rates)
        name = "HF generate, static cache" if args.hf_static else "HF generate greedy (NTP)"
        print(f"{name:<26} {hf_rate:9.1f} tokens/s")
    if NTP in rates:
        ntp, rpt = rates[NTP], rates[RPT]
        one_row, two_rows = statistics.median(bare[False]), statistics.median(bare[True])
        print(f"{'bare 1-row calls':<26} {one_row:9.1f} tokens/s")
        print(f"{'bare fused 2-row calls':<26} {two_rows:9.1f} tokens/s")
        if hf_rates:
            print(f"ntp / HF generate tokens/s: {ntp / hf_rate:.3f} (goal >= 0.9)")
        print(f"ratio rpt/ntp tokens/s: {rpt / ntp:.3f}; rpt calls per new token: {calls[RPT]:.3f} (goal <= 1.1)")
        print(f"ceiling on this machine (bare fused 2-row / 1-row calls): {two_rows / one_row:.3f}; "
              f"the decoder reaches {(rpt / ntp) / (two_rows / one_row):.3f} of it (goal >= 0.9)")
        if NTP_COMPILED in rates:
            print(f"compiled / eager tokens/s: ntp {rates[NTP_COMPILED] / ntp:.3f}, "
                  f"rpt {rates[RPT_COMPILED] / rpt:.3f}")
    if NTP_COMPILED in rates:
        for name in [n for n in rates if n.startswith("rpt compiled")]:
            print(f"{name} / ntp compiled tokens/s: {rates[name] / rates[NTP_COMPILED]:.3f} (goal >= 0.9)")
        if hf_rates:
            print(f"ntp compiled / HF generate tokens/s: {rates[NTP_COMPILED] / hf_rate:.3f}")
    return fell_back


if __name__ == "__main__":
    sys.exit(main())
