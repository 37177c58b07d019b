"""The repetition study's inputs (``eval/repetition.py``): its prompts and the key of each
(setting, prompt) result in the resumable store."""

from __future__ import annotations

import hashlib
import json
import random

from rpt.benchmarks.jsonl import EvalInputError, read_jsonl
from rpt.studies import repetition_study as study


def load_prompts(args, tokenizer) -> list[dict]:
    """``--limit`` prompts ``{"id", "prompt"}`` from ``--prompts``: stdlib snippets of ``--prompt-tokens``
    tokens (seeded by ``--seed-prompts``), HumanEval's prompts, or a JSONL file's ``prompt`` field."""
    if args.prompts == "humaneval":
        from rpt.benchmarks.humaneval import load_problems  # late: only this prompt set needs the benchmark

        items = [{"id": tid, "prompt": p["prompt"]} for tid, p in load_problems().items()]
    elif args.prompts == "stdlib":
        from rpt.data import stdlib_texts  # late: datasets and the tokenizer stack, only for stdlib prompts

        rng = random.Random(args.seed_prompts)
        items = []
        texts = stdlib_texts("validation", 0.05)
        for i in range(args.limit * 4):
            ids = tokenizer(texts[rng.randrange(len(texts))])["input_ids"]
            if len(ids) <= args.prompt_tokens + 8:
                continue
            start = rng.randrange(0, len(ids) - args.prompt_tokens)
            items.append({"id": f"stdlib-{i}", "prompt": tokenizer.decode(ids[start : start + args.prompt_tokens])})
    else:
        items = [{"id": r.get("id", i), "prompt": r["prompt"]} for i, r in enumerate(read_jsonl(args.prompts, required=["prompt"]))]
    if not items:
        raise EvalInputError(f"no prompts from {args.prompts!r}")
    return items[: args.limit]


def item_key(setting: study.Setting, prompt: dict, args) -> str:
    """The result store's key of one (setting, prompt): everything its record depends on."""
    spec = json.dumps([setting.name, setting.overrides, prompt["prompt"], args.max_new_tokens, args.min_len, args.min_repeats],
                      default=str)
    return hashlib.sha1(spec.encode()).hexdigest()
