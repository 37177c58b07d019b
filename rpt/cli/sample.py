"""``sample.py``'s command: its flags, the prompts it reads, the decode split across processes, what it
prints and writes (the script's docstring says what a user sees).

torch, transformers and the decoders load in :func:`run`: ``sample.py --help`` stays under a second.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from rpt.append_log import NotAJSONObject, json_object_lines
from rpt.cli.devices import check_device, resolve_dtype
from rpt.cli.model_args import add_model_args
from rpt.cli.output_paths import check_output
from rpt.cli.parser import report_input_error
from rpt.errors import InputError
from rpt.result_files import write_atomic
from rpt.sampling.entry_defaults import SAMPLE, explain_defaults
from rpt.sampling.flags import add_sampling_args, sampling_config_from_args
from rpt.sampling.text.chat import CHAT_HELP, add_chat_arg


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="one prompt text")
    src.add_argument("--prompts", metavar="FILE.jsonl", help="JSON Lines with 'prompt' and optional 'id'")
    ap.add_argument("--output", metavar="FILE.jsonl", help="write the completions here (JSON Lines)")
    ap.add_argument("--reference", action="store_true",
                    help="use the slow cache-free reference sampler (the test oracle)")
    group = add_model_args(ap, dtype="auto", device_after_parsing=True)
    add_chat_arg(group, CHAT_HELP + " (each prompt is one user turn; the output keeps the prompt as given)")
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
    from rpt.sampling import generate_reference  # late: torch
    from rpt.sampling.text.complete import complete  # late: torch
    from rpt.sampling.text.token_stream import TextStream  # late: torch

    streamer = TextStream(tokenizer, config.stop, prompt_text=records[0]["fed"]) if stream else None
    done = complete(model, tokenizer, prompt_ids, config, batch_size=args.batch_size, streamer=streamer,
                    decode=generate_reference if args.reference else None, compile=args.compile, row_seeds=seeds)
    results = [{"id": rec["id"], "prompt": rec["prompt"], "completion": c.text, "finish_reason": c.finish_reason,
                "new_tokens": len(c.new_ids)} for rec, c in zip(records, done)]
    batches = {id(c.stats): c.stats for c in done}.values()  # each batch's stats once
    totals = {k: sum(s[k] for s in batches) for k in ("new_tokens", "forward_passes", "corrections")}
    return results, totals


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    """The whole command: parse, check, decode, print or write; bad input is one ``error: ...`` line, exit 2."""
    args = build_parser(description).parse_args(argv)
    try:
        return run(args)
    except (ValueError, FileNotFoundError) as e:  # every InputError is a ValueError
        return report_input_error(e, traceback_hint=False)


def run(args: argparse.Namespace) -> int:
    if args.output:  # before any work: a path that cannot be written fails now, not after generating
        check_output(args.output, "--output", create_parents=False, example="out.jsonl")
    import torch  # late imports from here on: torch, accelerate, transformers
    from accelerate import PartialState
    from accelerate.utils import gather_object

    from rpt.sampling import randomness  # late: torch
    from rpt.sampling.loading import (  # late: torch
        check_checkpoint,
        encode,
        load_model,
        load_tokenizer,
        read_checkpoint_config,
    )
    from rpt.sampling.text import chat  # late: torch

    state = PartialState(cpu=not torch.accelerator.is_available())  # else CPU workers never form a group
    if args.batch_size < 1:
        raise InputError(f"--batch-size {args.batch_size} is invalid: use an integer >= 1")
    if args.compile and args.reference:
        raise InputError("--compile compiles the fast decoder's model step; the --reference sampler has none: drop one")
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
        write_atomic(args.output, "".join(json.dumps(rec, ensure_ascii=False) + "\n" for rec in results))
    elif not stream:
        for rec in results:
            print(json.dumps(rec, ensure_ascii=False))
    print(f"stats: {new} new tokens in {seconds:.2f}s, {new / max(seconds, 1e-9):.1f} tokens/s, "
          f"{calls / max(new, 1):.3f} model calls per token, {corrections} corrections"
          f"{f' ({state.num_processes} processes)' if state.num_processes > 1 else ''}", file=sys.stderr)
    return 0
