#!/usr/bin/env python
"""Tokenise a config's training (and validation) data into token stores, in parallel.

    python prepare_data.py --config configs/tiny.yaml                # into cache_dir, where train.py looks
    python prepare_data.py --config X.yaml --out data/x --num-proc 16  # then train with data: {tokens: data/x}
    python prepare_data.py --config X.yaml --out data/x --max-tokens 10_000_000_000  # --max-tokens needs --out

Without --out the stores go where train.py looks for them (cache_dir, keyed by the sources,
the held-out split and the tokenizer), so the next `train.py --config X.yaml` starts at once.
With --out, DIR/train and DIR/validation are written; a config then names them with
`data: {tokens: DIR}` (streamed sources need --out: training reads those from the stream).
"""

import argparse
import os
import sys

from rpt.config import ConfigError, load_config, report_input_error
from rpt.data import DataError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="YAML config (see configs/)")
    ap.add_argument("overrides", nargs="*", help="key=value overrides, e.g. seq_len=1024")
    ap.add_argument("--out", help="write DIR/train and DIR/validation (default: cache_dir, where train.py looks)")
    ap.add_argument("--num-proc", type=int, default=os.cpu_count() or 1, help="tokenising processes (default: all cores)")
    ap.add_argument("--max-tokens", type=lambda s: int(s.replace("_", "")), default=None, help="stop each split after this many tokens")
    ap.add_argument("--split", choices=["train", "validation", "both"], default="both")
    args = ap.parse_args(argv)
    from rpt.preflight import check_model_refs, check_output_dir

    try:
        cfg = load_config(args.config, args.overrides)
        check_output_dir(args.out or cfg.cache_dir, "--out" if args.out else "config key 'cache_dir'")
        check_model_refs(cfg)  # the tokenizer comes from one of them
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.num_proc < 1:
        print(f"error: --num-proc {args.num_proc} must be >= 1", file=sys.stderr)
        return 2
    if args.max_tokens is not None and not args.out:
        # train.py looks in cache_dir for the whole corpus's store: a cut one there is never read.
        print("error: --max-tokens needs --out DIR (train.py reads the whole corpus from cache_dir, never a cut "
              "store); pass --out DIR and train with data: {tokens: DIR}", file=sys.stderr)
        return 2

    from rpt.data import build_tokenizer, prepare_store, split_sources
    from rpt.data.sources import is_streaming, is_token_store
    from rpt.data.token_store import TokenStore

    splits = ["train", "validation"] if args.split == "both" else [args.split]
    if args.split == "both" and cfg.eval_batches == 0:
        splits = ["train"]
    try:
        for split in splits:
            sources, _ = split_sources(cfg, split)
            if is_streaming(sources) and not is_token_store(sources) and not args.out:
                raise DataError(f"{split} data is streamed, so train.py reads it from the stream; to tokenise it ahead, "
                                "pass --out DIR and train with data: {tokens: DIR}")
        tokenizer = build_tokenizer(cfg)
        for split in splits:
            sources, _ = split_sources(cfg, split)
            if is_token_store(sources):
                print(f"{split}: already a token store ({sources}); nothing to do")
                continue
            path = os.path.join(args.out, split) if args.out else None
            path = prepare_store(cfg, split, tokenizer, path, num_proc=args.num_proc, max_tokens=args.max_tokens)
            meta = TokenStore(path).meta
            print(f"{split}: {meta['num_tokens']:,} tokens ({meta['dtype']}) at {meta['tokens_per_s']:,.0f} tokens/s "
                  f"with {meta['num_proc']} process(es), in {path}")
        if args.out:
            print(f"train with:  data: {{tokens: {args.out}}}")
    except (DataError, ValueError, FileNotFoundError) as e:
        return report_input_error(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
