"""RPT inside vLLM against vLLM's plain NTP and against our own decoder: tokens/s at 8 and 32
concurrent requests of ragged prompt lengths, the rows each step feeds, and what a correction costs.

One RPT checkpoint (a randomly initialised Llama built from a config, a random offset table, window
3; no download), greedy, float32, prompts of 8-64 random tokens, ``--new`` tokens each, EOS ignored,
all requests submitted at once. Arms, each a fresh subprocess (one engine per process), alternated
round by round:

* ``vllm_ntp``      : ``LLM(**rpt_engine_args(ckpt))`` serving plain requests (the same engine, no RPT);
* ``vllm_rpt``      : the same engine, every request ``rpt_iters=1, rpt_window=3, confidence=0.9``;
* ``vllm_rpt_low``  : the same with ``confidence=0`` (a correction wherever PTP's argmax differs: the difference in time
  over the difference in corrections is what one correction costs);
* ``ours``          : ``rpt.sampling.generate`` on the same prompts as one left-padded batch (eager),
  ``confidence=0.9``.

Reported per arm and batch: tokens/s (median of ``--repeats`` timed runs after a warm-up), engine
steps, the rows an RPT request's step feeds (scheduled tokens per request per step, the re-fed token
included), corrections.

    .venv-vllm/bin/python benchmarks/vllm_rpt.py --rounds 2     # make test-vllm builds .venv-vllm
"""

from __future__ import annotations

import json
import os
import statistics
import time

from vllm_rounds import parse_args, run_rounds  # benchmarks/ (the script's folder, on sys.path)

ARMS = ("vllm_ntp", "vllm_rpt", "vllm_rpt_low", "ours")
MODEL = dict(vocab_size=32000, hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=4, max_position_embeddings=1024)  # head_dim 64: vLLM's CPU attention takes it
CONFIDENCE = {"vllm_rpt": 0.9, "vllm_rpt_low": 0.0, "ours": 0.9}


def build_checkpoint(path: str) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rpt.model import RPTForCausalLM

    if os.path.exists(os.path.join(path, "rpt_config.json")):
        return
    torch.manual_seed(0)
    model = RPTForCausalLM.from_base(LlamaForCausalLM(LlamaConfig(**MODEL)), window=3)
    with torch.no_grad():
        model.offset_embedding.weight.normal_(0, 0.5)
    model.save_pretrained(path)


def prompts(batch: int) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(batch)
    return [torch.randint(1, MODEL["vocab_size"], (int(n),), generator=g).tolist()
            for n in torch.randint(8, 65, (batch,), generator=g)]


def run_ours(args, ps) -> dict:
    import torch

    from rpt.model import RPTForCausalLM
    from rpt.sampling import SamplingConfig, generate

    model = RPTForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32).eval()
    width = max(len(p) for p in ps)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in ps])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ps])
    config = SamplingConfig(max_new_tokens=args.new, rpt_iters=1, rpt_window=3, confidence=CONFIDENCE["ours"],
                            eos_token_id=[])
    generate(model, ids, config, attention_mask=mask)
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        out = generate(model, ids, config, attention_mask=mask)
        times.append(time.perf_counter() - t0)
    tokens = sum(len(out.generated(b)) for b in range(len(ps)))
    return {"tokens_per_s": tokens / statistics.median(times), "steps": out.stats["forward_passes"],
            "rows_per_request_step": None, "corrections": out.stats["corrections"]}


def run_engine(args, ps) -> dict:
    from vllm import LLM, SamplingParams

    from rpt.integrations.vllm_rpt.launch import rpt_engine_args
    from rpt.integrations.vllm_rpt.scheduler import RPTScheduler

    counts = {"steps": 0, "rpt_rows": 0, "rpt_request_steps": 0}
    original = RPTScheduler.update_from_output

    def counted(self, scheduler_output, model_runner_output):
        counts["steps"] += 1
        for req_id, drafts in scheduler_output.scheduled_spec_decode_tokens.items():
            if req_id in self.rpt_requests:  # a decode step of an RPT request: the re-fed token and its drafts
                counts["rpt_rows"] += 1 + len(drafts)
                counts["rpt_request_steps"] += 1
        return original(self, scheduler_output, model_runner_output)

    RPTScheduler.update_from_output = counted
    llm = LLM(**rpt_engine_args(args.model, dtype="float32", max_model_len=1024, max_num_seqs=args.batch,
                                skip_tokenizer_init=True, seed=0))
    extra = None if args.arm == "vllm_ntp" else {"rpt_iters": 1, "rpt_window": 3, "confidence": CONFIDENCE[args.arm]}
    params = SamplingParams(temperature=0, max_tokens=args.new, ignore_eos=True, detokenize=False, extra_args=extra)
    requests = [{"prompt_token_ids": p} for p in ps]
    llm.generate(requests, params, use_tqdm=False)
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    times, corrections = [], 0
    for _ in range(args.repeats):
        for key in counts:
            counts[key] = 0
        runner.__dict__["rpt_drivers"] = {}
        t0 = time.perf_counter()
        outs = llm.generate(requests, params, use_tqdm=False)
        times.append(time.perf_counter() - t0)
        corrections = sum(d.corrections for d in runner.__dict__["rpt_drivers"].values() if d is not None)
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    rows = counts["rpt_rows"] / counts["rpt_request_steps"] if counts["rpt_request_steps"] else None
    return {"tokens_per_s": tokens / statistics.median(times), "steps": counts["steps"],
            "rows_per_request_step": rows, "corrections": corrections, "seconds": statistics.median(times)}


def main() -> None:
    args = parse_args(__doc__, ARMS, rounds=2, repeats=2, new=32, model="runs/bench_vllm_rpt/model")
    if args.arm:
        ps = prompts(args.batch)
        row = run_ours(args, ps) if args.arm == "ours" else run_engine(args, ps)
        print(json.dumps({"arm": args.arm, "batch": args.batch, **row}))
        return
    build_checkpoint(args.model)
    results = run_rounds(__file__, args, ARMS, lambda r, batch, arm, row: f"round {r} batch {batch:3d} {arm:12s} "
                         f"{json.dumps(row)}")
    for batch in args.batches:
        med = {arm: statistics.median(x["tokens_per_s"] for x in results[(arm, batch)]) for arm in ARMS}
        high, low = results[("vllm_rpt", batch)], results[("vllm_rpt_low", batch)]
        extra_s = statistics.median(b["seconds"] - a["seconds"] for a, b in zip(high, low))
        extra_c = statistics.median(b["corrections"] - a["corrections"] for a, b in zip(high, low))
        steps = {arm: results[(arm, batch)][-1]["steps"] for arm in ARMS}
        print(f"batch {batch}: " + ", ".join(f"{arm} {med[arm]:.1f} tokens/s ({steps[arm]} steps)" for arm in ARMS)
              + f"; RPT/NTP {med['vllm_rpt'] / med['vllm_ntp']:.3f}x, vLLM RPT/ours {med['vllm_rpt'] / med['ours']:.3f}x"
              + f"; rows per RPT request step {high[-1]['rows_per_request_step']:.2f}"
              + f"; corrections eta 0.9: {high[-1]['corrections']}, eta 0: {low[-1]['corrections']}"
              + (f"; one correction costs {1000 * extra_s / extra_c:.2f} ms of the run" if extra_c > 0 else ""))


if __name__ == "__main__":
    main()
