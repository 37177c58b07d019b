"""The repetition study's inputs (``eval/repetition.py``): its prompts and the key of each
(setting, prompt) result in the resumable store."""

from __future__ import annotations

import hashlib
import json
import random

from rpt.cli.devices import check_device
from rpt.cli.output_paths import REPORT_SIBLINGS, output_problem
from rpt.evaluation.user_jsonl import EvalInputError, read_jsonl
from rpt.studies.repetition import study

FAMILIES = ("none", "repetition", "frequency", "lz", "rpt_lz")


def check_args(args) -> None:
    """``eval/repetition.py``'s flags before the model loads: one :class:`EvalInputError` naming the flag."""
    problem = output_problem(args.out, "--out", siblings=REPORT_SIBLINGS)
    if problem is not None:
        raise EvalInputError(problem)
    unknown = sorted(set(args.families) - set(FAMILIES))
    if unknown:
        raise EvalInputError(f"--families {' '.join(unknown)}: not a family of the study; use some of {', '.join(FAMILIES)}")
    for flag, value, low in (("--limit", args.limit, 1), ("--prompt-tokens", args.prompt_tokens, 1),
                             ("--min-len", args.min_len, 1), ("--min-repeats", args.min_repeats, 2),
                             ("--batch-size", args.batch_size, 1), ("--rpt-iters", args.rpt_iters, 0),
                             ("--rpt-window", args.rpt_window, 2)):
        if value < low:
            raise EvalInputError(f"{flag} {value} is invalid: use an integer >= {low}")
    check_device(args.device)


def load_prompts(args, tokenizer) -> list[dict]:
    """``--limit`` prompts ``{"id", "prompt"}`` from ``--prompts``: stdlib snippets of ``--prompt-tokens``
    tokens (seeded by ``--seed-prompts``), HumanEval's prompts, or a JSONL file's ``prompt`` field."""
    if args.prompts == "humaneval":
        from rpt.evaluation.humaneval import load_problems  # late: only this prompt set needs the benchmark

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
        def validate(obj: dict) -> None:
            if not isinstance(obj["prompt"], str):
                raise ValueError(f"'prompt' must be a string, got {type(obj['prompt']).__name__}")

        rows = read_jsonl(args.prompts, required=["prompt"], validate=validate)
        items = [{"id": r.get("id", i), "prompt": r["prompt"]} for i, r in enumerate(rows)]
    if not items:
        raise EvalInputError(f"no prompts from {args.prompts!r}")
    return items[: args.limit]


def item_key(setting: study.Setting, prompt: dict, args) -> str:
    """The result store's key of one (setting, prompt): everything its record depends on; a compiled
    decode's key apart from an eager one's (as :func:`rpt.evaluation.sweep.generation_key`; eager keys as
    before)."""
    parts = [setting.name, setting.overrides, prompt["prompt"], args.max_new_tokens, args.min_len, args.min_repeats]
    if getattr(args, "compile", False):
        parts.append({"compile": args.compile})
    spec = json.dumps(parts, default=str)
    return hashlib.sha1(spec.encode()).hexdigest()
