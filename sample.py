"""Sample from an RPT checkpoint (or a plain causal LM with ``--rpt-iters 0``).

    python sample.py --checkpoint runs/tiny/final --prompt "def fib(n):" --rpt-iters 1 --max-new-tokens 64
    python sample.py --checkpoint DIR --prompts prompts.jsonl --output out.jsonl --batch-size 8
    accelerate launch sample.py --checkpoint DIR --prompts prompts.jsonl --output out.jsonl

``--prompts`` is JSON Lines: ``{"prompt": "...", "id": ...}`` per line (``id`` optional; the line's
0-based index otherwise). A single prompt streams its completion to stdout as tokens become final;
several prompts print (or, with ``--output``, atomically write) one JSON object per prompt in
input order: ``id``, ``prompt``, ``completion`` (cut at the first stop string), ``finish_reason``
(``eos``, ``stop``, ``length``), ``new_tokens``. A stats line (tokens/s, model calls per token,
corrections) ends the run on stderr. Under ``accelerate launch`` the prompts are split across
processes and the main process writes the merged output. Bad input is one ``error: ...`` line and
exit status 2. Every sampling knob is a flag (``--help``). With ``--seed S`` prompt i's random draws
are keyed by a hash of ``(S, i)`` (the same text whatever the batch size or process count; seeds S and
S + 1 share no draws); ``--compile`` compiles the decode steps (``torch.compile``, fixed shapes).
``--chat`` applies the tokenizer's chat template to each prompt (one user turn, with the generation
prompt) for instruction-tuned models; a tokenizer without one is refused.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from rpt.append_log import NotAJSONObject, json_object_lines
from rpt.sampling.entry_defaults import SAMPLE, explain_defaults
from rpt.sampling.flags import add_compile_arg, add_sampling_args, sampling_config_from_args
from rpt.sampling.precision import DTYPE_CHOICES
from rpt.sampling.text.chat import CHAT_HELP, add_chat_arg

# torch, transformers and the decoders load in _main: `sample.py --help` stays under a second.


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="RPT checkpoint directory (or plain HF model for --rpt-iters 0)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="one prompt text")
    src.add_argument("--prompts", metavar="FILE.jsonl", help="JSON Lines with 'prompt' and optional 'id'")
    ap.add_argument("--output", metavar="FILE.jsonl", help="write the completions here (JSON Lines)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: cuda if available)")
    ap.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                    help="weights dtype (auto: bfloat16 on CUDA, float32 on CPU)")
    ap.add_argument("--reference", action="store_true",
                    help="use the slow cache-free reference sampler (the test oracle)")
    add_compile_arg(ap)
    add_chat_arg(ap, CHAT_HELP + " (each prompt is one user turn; the output keeps the prompt as given)")
    add_sampling_args(ap)
    return explain_defaults(ap, SAMPLE)


def read_prompts(path: str) -> list[dict]:
    """``[{"id", "prompt"}]`` from JSON Lines; ``ValueError`` naming the file and line of any bad record."""
    if os.path.isdir(path):
        raise ValueError(f"prompts file {path!r} is a directory; give a JSON Lines file")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"prompts file {path!r} does not exist")
    records = []
    try:
        for lineno, rec in json_object_lines(path):
            if not isinstance(rec.get("prompt"), str):
                raise ValueError(f"{path} line {lineno}: 'prompt' must be present and a string")
            records.append({"id": rec.get("id", len(records)), "prompt": rec["prompt"]})
    except NotAJSONObject as e:
        problem = e.problem("invalid JSON ({})", "expected a JSON object with a 'prompt' field")
        raise ValueError(f"{path} line {e.line}: {problem}") from None
    if not records:
        raise ValueError(f"{path} holds no prompts")
    return records


def run_batches(model, tokenizer, records, prompt_ids, config, args, stream: bool, seeds: list[int] | None = None):
    from rpt.sampling import generate_reference
    from rpt.sampling.text.complete import complete
    from rpt.sampling.text.token_stream import TextStream

    streamer = TextStream(tokenizer, config.stop, prompt_text=records[0]["fed"]) if stream else None
    done = complete(model, tokenizer, prompt_ids, config, batch_size=args.batch_size, streamer=streamer,
                    decode=generate_reference if args.reference else None, compile=args.compile, row_seeds=seeds)
    results = [{"id": rec["id"], "prompt": rec["prompt"], "completion": c.text, "finish_reason": c.finish_reason,
                "new_tokens": len(c.new_ids)} for rec, c in zip(records, done)]
    batches = {id(c.stats): c.stats for c in done}.values()  # each batch's stats once
    totals = {k: sum(s[k] for s in batches) for k in ("new_tokens", "forward_passes", "corrections")}
    return results, totals


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _main(args)
    except (ValueError, FileNotFoundError) as e:  # ConfigError and ModelRefError are ValueErrors
        print(f"error: {e}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    from rpt.training.preflight import check_output_file

    if args.output:  # before any work: a path that cannot be written fails now, not after generating
        check_output_file(args.output, "--output")
    import torch
    from accelerate import PartialState
    from accelerate.utils import gather_object

    from rpt.devices import check_device
    from rpt.sampling import randomness
    from rpt.sampling.loading import (
        check_checkpoint,
        encode,
        load_model,
        load_tokenizer,
        read_checkpoint_config,
    )
    from rpt.sampling.precision import resolve_dtype
    from rpt.sampling.text import chat

    state = PartialState(cpu=not torch.accelerator.is_available())  # else CPU workers never form a group
    if args.batch_size < 1:
        raise ValueError(f"--batch-size {args.batch_size} is invalid: use an integer >= 1")
    if args.compile and args.reference:
        raise ValueError("--compile compiles the fast decoder's model step; the --reference sampler has none: drop one")
    device = check_device(args.device) if args.device else (str(state.device) if state.num_processes > 1 else
                                                             "cuda" if torch.cuda.is_available() else "cpu")
    dtype = resolve_dtype(args.dtype, device)
    records = read_prompts(args.prompts) if args.prompts else [{"id": 0, "prompt": args.prompt}]
    sampling_config_from_args(args)  # flag errors first, before loading anything
    tokenizer = load_tokenizer(args.checkpoint)
    if args.chat:
        chat.require_chat_template(tokenizer, args.checkpoint)
    for rec in records:  # the text the model continues
        rec["fed"] = chat.user_prompt(tokenizer, rec["prompt"]) if args.chat else rec["prompt"]
    config = sampling_config_from_args(args, tokenizer)
    rpt_config = read_checkpoint_config(args.checkpoint)  # checked before any weight is read
    check_checkpoint(rpt_config, config, args.checkpoint)
    model = load_model(args.checkpoint, rpt_config, device, dtype)
    prompt_ids = encode(tokenizer, [{"id": r["id"], "prompt": r["fed"]} for r in records], model)

    stream = len(records) == 1 and state.num_processes == 1
    start = time.perf_counter()
    order = list(range(len(records)))
    with state.split_between_processes(order) as mine:
        mine = list(mine)
        # prompt i's draws are keyed by row_seed(seed, i), whichever process decodes it
        seeds = None if config.seed is None else [randomness.row_seed(config.seed, i) for i in mine]
        results, totals = run_batches(model, tokenizer, [records[i] for i in mine], [prompt_ids[i] for i in mine],
                                      config, args, stream, seeds)
    seconds = time.perf_counter() - start
    results = gather_object(results)  # rank order = input order (contiguous splits)
    all_totals = gather_object([totals])
    if not state.is_main_process:
        return 0
    new = sum(t["new_tokens"] for t in all_totals)
    calls = sum(t["forward_passes"] for t in all_totals)
    corrections = sum(t["corrections"] for t in all_totals)
    if args.output:
        tmp = f"{args.output}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            for rec in results:
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        os.replace(tmp, args.output)
    elif not stream:
        for rec in results:
            print(json.dumps(rec, ensure_ascii=False))
    print(f"stats: {new} new tokens in {seconds:.2f}s, {new / max(seconds, 1e-9):.1f} tokens/s, "
          f"{calls / max(new, 1):.3f} model calls per token, {corrections} corrections"
          f"{f' ({state.num_processes} processes)' if state.num_processes > 1 else ''}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
