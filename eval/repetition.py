"""Degenerate-repetition study (LZ-penalty paper, Fig. 2): loops per sampler, with quality beside.

    python eval/repetition.py --checkpoint runs/demo/rpt/final --limit 32 --out runs/eval/repetition.json

Settings: no penalty, repetition penalty {1.1, 1.2, 1.25, 1.3, 1.5}, frequency penalty
{0.1 ... 1.0}, LZ penalty (0.15, 512, 32), and RPT (k=1, w=2) with the LZ penalty, at each of
``--temperatures`` (default greedy only). Prompts: ``--prompts stdlib`` (snippets of the Python
standard library's validation files), ``humaneval``, or a JSONL file with a ``prompt`` field.
Writes ``F.json`` (``settings``: degenerate rate and mean log-likelihood per setting;
``degenerate_rate`` by family at the first temperature), ``F.md`` and ``F.png``; finished
(setting, prompt) pairs are kept in ``F.items.jsonl`` so a rerun resumes.
"""

from __future__ import annotations

import argparse
import sys

from tqdm import tqdm

from rpt.cli.model_args import add_model_args
from rpt.cli.parser import report_input_error
from rpt.evaluation.batched_generation import (
    generate_texts,
    load_checkpoint,
    split_across_processes,
)
from rpt.evaluation.sweep import fallback_note
from rpt.evaluation.user_jsonl import EvalInputError
from rpt.result_files import ResultStore, save_figure, sibling, write_json, write_markdown
from rpt.sampling.flags import add_sampling_args, sampling_config_from_args
from rpt.sampling.loading import check_checkpoint
from rpt.studies.repetition import study
from rpt.studies.repetition.inputs import check_args, item_key, load_prompts

STUDY_KNOBS = ("temperature", "repetition_penalty", "frequency_penalty", "lz_penalty", "lz_window", "lz_buffer",
               "rpt_iters", "rpt_window", "max_new_tokens")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    add_sampling_args(p, exclude=STUDY_KNOBS)
    p.add_argument("--prompts", default="stdlib", help="stdlib | humaneval | FILE.jsonl (field 'prompt')")
    p.add_argument("--prompt-tokens", type=int, default=48, help="length of stdlib snippets, in tokens")
    p.add_argument("--limit", type=int, default=32, help="number of prompts")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0])
    p.add_argument("--rpt-iters", type=int, default=1, help="RPT iterations for the RPT + LZ setting (0 leaves it out)")
    p.add_argument("--rpt-window", type=int, default=2)
    p.add_argument("--min-len", type=int, default=1, help="shortest repeated unit, in tokens")
    p.add_argument("--min-repeats", type=int, default=20)
    p.add_argument("--families", nargs="+", default=["none", "repetition", "frequency", "lz", "rpt_lz"])
    p.add_argument("--seed-prompts", type=int, default=0)
    p.add_argument("--fresh", action="store_true", help="ignore results kept from an earlier run")
    p.add_argument("--out", default="runs/eval/repetition.json")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_args(args)
        model, tokenizer, window = load_checkpoint(args.checkpoint, args.device, args.dtype)
        base = sampling_config_from_args(args, tokenizer, max_new_tokens=args.max_new_tokens)
        rpt_iters = args.rpt_iters if window is not None else 0
        settings = [s for s in study.study_settings(args.temperatures, rpt_iters=rpt_iters, rpt_window=args.rpt_window)
                    if s.family in args.families]
        for s in settings:
            check_checkpoint(window, s.config(base), args.checkpoint)
        prompts = load_prompts(args, tokenizer)
    except (EvalInputError, ValueError, FileNotFoundError) as e:
        return report_input_error(e, traceback_hint=False)
    store = ResultStore(args.out, fresh=args.fresh)
    mine, gather = split_across_processes(prompts)
    records: dict[str, list[dict]] = {}
    with tqdm(total=len(settings) * len(mine), desc="repetition", unit="gen") as bar:
        for s in settings:
            todo = [p for p in mine if item_key(s, p, args) not in store]
            bar.update(len(mine) - len(todo))
            if todo:
                outs = generate_texts(model, tokenizer, [p["prompt"] for p in todo], s.config(base), args.batch_size,
                                      on_batch=bar.update, compile=args.compile)
                for p, o in zip(todo, outs):
                    rec = study.score_continuation(model, o["prompt_ids"], o["new_ids"], args.min_len, args.min_repeats)
                    store.add(item_key(s, p, args), {**rec, "id": p["id"], "text": o["text"], "path": o["path"]})
            records[s.name] = gather([store.get(item_key(s, p, args)) for p in mine])
    rows = study.summarise(settings, records)
    first_t = args.temperatures[0]
    by_family = {}
    for r in rows:
        if r["temperature"] == first_t and r["family"] in ("none", "lz", "rpt_lz"):
            by_family[r["family"]] = r["degenerate_rate"]
    for family in ("repetition", "frequency"):
        # the family's best (lowest) degenerate rate over its sweep, as the paper compares
        vals = [r["degenerate_rate"] for r in rows if r["family"] == family and r["temperature"] == first_t]
        if vals:
            by_family[family] = min(vals)
    summary = {
        "benchmark": "degenerate_repetition", "checkpoint": args.checkpoint, "n_prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens, "min_len": args.min_len, "min_repeats": args.min_repeats,
        "degenerate_rate": by_family, "settings": rows,
    }
    paths = [write_json(args.out, summary)]
    cols = ["setting", "n", "degenerate_rate", "mean_loglik", "mean_new_tokens"]
    notes = (f"{len(prompts)} prompts from {args.prompts}, {args.max_new_tokens} new tokens; degenerate = a unit of >= "
             f"{args.min_len} tokens repeated >= {args.min_repeats} times back to back. `mean_loglik`: the model's own "
             "NTP log-likelihood of the continuation (nats/token).")
    paths.append(write_markdown(sibling(args.out, ".md"), "Degenerate repetition by sampler", [(cols, [[r[c] for c in cols] for r in rows])], notes))
    paths.append(save_figure(study.plot_study(rows), sibling(args.out, ".png")))
    print("degenerate rate: " + ", ".join(f"{k} {v:.3f}" for k, v in by_family.items()))
    for note in filter(None, (fallback_note(r["setting"], r["decoded_by"]) for r in rows)):
        print(note)  # completions a compile failure decoded eagerly
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
