#!/usr/bin/env python
"""Tokenise a config's training (and validation) data into token stores, in parallel.

    python prepare_data.py --config configs/tiny.yaml                # into cache_dir, where train.py looks
    python prepare_data.py --config X.yaml --out data/x --num-proc 16  # then train with data: {tokens: data/x}
    python prepare_data.py --config X.yaml --out data/x --max-tokens 10_000_000_000  # --max-tokens needs --out
    python prepare_data.py --verify data/x       # read the stores in full: SHA-256 of each shard, token ids

Without --out the stores go where train.py looks for them (cache_dir, keyed by the sources,
the held-out split and the tokenizer), so the next `train.py --config X.yaml` starts at once.
With --out, DIR/train and DIR/validation are written; a config then names them with
`data: {tokens: DIR}` (streamed sources need --out: training reads those from the stream).
"""

import argparse
import math
import os
import sys

from rpt.cli.output_paths import check_output
from rpt.cli.parser import OneLineArgumentParser, report_input_error
from rpt.data import DataError
from rpt.errors import InputError
from rpt.training.config import ConfigError, load_config

MAX_PROCESSES = 1024  # beyond this a typo (--num-proc 100000) would spawn a process per shard


def token_count(text: str) -> int:
    """``--max-tokens``: a positive whole number, as ``10_000_000``, ``1e10`` or ``10000``."""
    value = text.replace("_", "").strip()
    try:
        number = int(value)
    except ValueError:
        try:
            real = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of tokens (e.g. 10_000_000 or 1e7)") from None
        if not math.isfinite(real) or real != int(real):
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of tokens") from None
        number = int(real)
    if number < 1:
        raise argparse.ArgumentTypeError(f"{text} would write {'no' if number == 0 else 'a negative number of'} tokens: "
                                         "give a positive number, or leave --max-tokens out for the whole corpus")
    return number


def verify(paths: list[str]) -> int:
    """``--verify DIR``: every shard of the stores at DIR (or DIR/train, DIR/validation) against the
    SHA-256 recorded when it was written, and every token id within the vocabulary."""
    from rpt.data.token_store import INDEX, TokenStore

    for root in paths:
        stores = [root] if os.path.isfile(os.path.join(root, INDEX)) else [
            os.path.join(root, s) for s in ("train", "validation") if os.path.isfile(os.path.join(root, s, INDEX))]
        if not stores:
            raise DataError(f"{root} is not a token store (no {INDEX} in it, in train/ or in validation/)")
        for path in stores:
            done = TokenStore(path).verify()
            print(f"{path}: {done['shards']} shard(s), {done['bytes'] / 1e6:,.1f} MB verified (SHA-256 and token ids) "
                  f"in {done['seconds']:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = OneLineArgumentParser(prog=os.path.basename(__file__), description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="YAML config (see configs/)")
    ap.add_argument("overrides", nargs="*", help="key=value overrides, e.g. seq_len=1024")
    ap.add_argument("--out", help="write DIR/train and DIR/validation (default: cache_dir, where train.py looks)")
    ap.add_argument("--num-proc", type=int, default=os.cpu_count() or 1, help="tokenising processes (default: all cores)")
    ap.add_argument("--max-tokens", type=token_count, default=None, help="stop each split after this many tokens")
    ap.add_argument("--split", choices=["train", "validation", "both"], default="both")
    ap.add_argument("--verify", nargs="+", metavar="DIR",
                    help="check written stores in full instead of writing (each shard's SHA-256, token ids in the "
                         "vocabulary): one read of the data")
    args = ap.parse_args(argv)
    if args.verify:
        try:
            return verify(args.verify)
        except DataError as e:
            return report_input_error(e)
    if not args.config:
        ap.error("--config is required (or --verify DIR)")
    from rpt.training.preflight import check_model_refs

    try:
        cfg = load_config(args.config, args.overrides)
        check_output(args.out or cfg.cache_dir, "--out" if args.out else "config key 'cache_dir'", ConfigError,
                     directory=True)
        check_model_refs(cfg)  # the tokenizer comes from one of them
    except ConfigError as e:
        return report_input_error(e, traceback_hint=False)
    if not 1 <= args.num_proc <= MAX_PROCESSES:
        return report_input_error(InputError(f"--num-proc {args.num_proc} must be between 1 and {MAX_PROCESSES}"),
                                  traceback_hint=False)
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
            print(f"{split}: {meta['num_tokens']:,} tokens ({meta['dtype']}) at {meta.get('tokens_per_s', 0):,.0f} "
                  f"tokens/s with {meta.get('num_proc', '?')} process(es), in {path}")
        if args.out:
            print(f"train with:  data: {{tokens: {args.out}}}")
    except (DataError, ValueError, OSError) as e:  # OSError: a file that cannot be read or written, named by it
        return report_input_error(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
