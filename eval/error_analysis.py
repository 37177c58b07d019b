"""The RPT paper's error analysis (Sec. 5.3): Table 2 (eps_k by RPT iteration) and Fig. 6.

    python eval/error_analysis.py --checkpoint runs/t1/final --limit 1000 --out runs/eval/error_analysis.json
    python eval/error_analysis.py --checkpoint DIR --text-file valid.txt --exact --out F.json

At positions of the validation text with at least ``--min-context`` tokens of context (at most
``--context-len`` of them are fed), ``eps_k = 1 - p_k(x_i | x_<i)`` after k = 0..iters
iterations of the w = 2 RPT chain started from NTP (see :mod:`rpt.studies.error_analysis`).
Text: ``--data F.jsonl`` (a ``text`` field per line), ``--text-file F`` (one document), or by
default the validation split of the Python standard library. Each document is tokenised without
special tokens and preceded by EOS, as in the training stream. ``--top-m M`` (default 16) is
the truncated estimator, with a certified per-position error bound (``tv_error_bound_by_iters``,
the mean bound, is loose); ``--exact`` enumerates the vocabulary (small vocabularies: about 0.4
positions/s at V = 4096 on 2 CPU cores, against about 65 for ``--top-m 16``).

Writes ``F.json`` (``tv_by_iters`` with ``tv_ci_by_iters``, ``tv_change_1_0`` (eps_1 - eps_0)
with its interval, the estimator's bound and a verdict, ``frac_improved`` with its interval,
``n_positions``, ``estimator``, ``histogram``, ...; intervals: 95% bootstrap over positions), ``F.md`` and ``F.png`` (the Fig. 6 histogram of ``p_1 - p_0``); finished
positions are kept in ``F.items.jsonl`` so a rerun on the same ``--out`` skips them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from rpt.benchmarks.jsonl import EvalInputError, read_jsonl
from rpt.model import RPT_TABLE_NAME
from rpt.model_ref import ModelRefError, resolve_model_ref
from rpt.report import ResultStore, save_figure, sibling, write_json, write_markdown
from rpt.studies import error_analysis as ea

DEFAULT_OUT = "runs/eval/error_analysis.json"
DEFAULT_TOP_M = 16
# Exact mode holds two [batch, V, V] float64 matrices; cap their size at about 1 GB.
EXACT_MAX_ELEMENTS = 2**26


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit code 2, like every other bad input
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="RPT checkpoint directory (with its tokenizer)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--data", default=None, help="JSONL file with a 'text' field per line")
    source.add_argument("--text-file", default=None, help="a plain text file, read as one document")
    parser.add_argument("--val-fraction", type=float, default=0.05, help="stdlib validation share (default data)")
    parser.add_argument("--limit", type=int, default=1000, help="number of positions (0: all of them)")
    parser.add_argument("--min-context", type=int, default=20, help="tokens of context a position needs")
    parser.add_argument("--context-len", type=int, default=128, help="at most this many context tokens are fed")
    est = parser.add_mutually_exclusive_group()
    est.add_argument("--top-m", type=int, default=DEFAULT_TOP_M, help="top-m estimator (default %(default)s)")
    est.add_argument("--exact", action="store_true", help="enumerate the whole vocabulary")
    parser.add_argument("--iters", type=int, default=3, help="RPT iterations k = 0..iters")
    parser.add_argument("--ptp", choices=("sampled", "greedy"), default="sampled",
                        help="PTP step: draw from the PTP conditional (eq. 4 as written, default) or take its "
                             "argmax (the paper's main results and the sampler's default)")
    parser.add_argument("--confidence", type=float, default=0.0,
                        help="keep x_i unless the PTP proposal's probability exceeds this (the sampler's eta; "
                             "the paper uses 0.9 with --ptp greedy; default %(default)s)")
    parser.add_argument("--precondition", type=int, default=0, metavar="N",
                        help="also compare the PTP head's loss with the NTP-implied P*'s on N positions (exact: "
                             "V NTP queries each; default %(default)s = skip)")
    parser.add_argument("--batch-size", type=int, default=16, help="positions per forward")
    parser.add_argument("--seed", type=int, default=0, help="position sampling seed")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--fresh", action="store_true", help="ignore finished positions of an earlier run")
    parser.add_argument("--out", default=DEFAULT_OUT, help="output JSON; .md/.png go beside it")
    return parser


def check_args(args: argparse.Namespace) -> None:
    if not 0.0 <= args.confidence <= 1.0:
        raise EvalInputError(f"--confidence {args.confidence}: use a probability in [0, 1] (the paper's eta is 0.9)")
    if args.min_context < 1 or args.context_len < args.min_context:
        raise EvalInputError("need 1 <= --min-context <= --context-len")
    if args.precondition < 0:
        raise EvalInputError("--precondition N: use N >= 0 positions")
    if args.limit < 0 or args.iters < 1 or args.batch_size < 1 or (not args.exact and args.top_m < 1):
        raise EvalInputError("need --limit >= 0, --iters >= 1, --batch-size >= 1 and --top-m >= 1")
    if not 0.0 < args.val_fraction < 1.0:
        raise EvalInputError("--val-fraction must be in (0, 1)")


def load_texts(args: argparse.Namespace) -> tuple[list[str], str]:
    """The validation documents and a label for the JSON."""
    if args.data:
        def validate(obj: dict) -> None:
            if not isinstance(obj["text"], str):
                raise ValueError("'text' must be a string")
        return [r["text"] for r in read_jsonl(args.data, required=("text",), validate=validate)], args.data
    if args.text_file:
        path = Path(args.text_file)
        if not path.is_file():
            raise EvalInputError(f"{path}: file not found")
        return [path.read_text(encoding="utf-8", errors="replace")], args.text_file
    from rpt.data import stdlib_texts

    return stdlib_texts("validation", args.val_fraction), f"stdlib:validation:{args.val_fraction:g}"


def load_model(args: argparse.Namespace):
    """Model and tokenizer; every failure becomes an :class:`EvalInputError`."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from rpt.model import RPTForCausalLM

    hf_logging.disable_progress_bar()  # the weight-loading bar would bury the one-line errors
    try:
        args.checkpoint = resolve_model_ref(args.checkpoint, "--checkpoint", "train one first or check the path")
    except ModelRefError as e:
        raise EvalInputError(str(e)) from None
    try:
        model = RPTForCausalLM.from_pretrained(args.checkpoint).to(args.device).eval()
        tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    except (OSError, ValueError) as exc:
        raise EvalInputError(f"{args.checkpoint}: cannot load the RPT checkpoint and tokenizer ({exc})") from None
    max_pos = getattr(model.config, "max_position_embeddings", None)
    if max_pos is not None and args.context_len + 2 > max_pos:
        raise EvalInputError(f"--context-len {args.context_len} + 2 query places exceed the model's {max_pos} positions")
    return model, tokenizer


def tokenise(texts: list[str], tokenizer) -> list[list[int]]:
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    eos = tokenizer.eos_token_id
    return [([eos] if eos is not None else []) + list(doc) for doc in ids]


def checkpoint_fingerprint(path: str) -> list:
    """Path, names, sizes and mtimes of the weight files: a retrained checkpoint in the same
    directory must not reuse stale results."""
    root = Path(path).resolve()
    files = sorted(f for f in root.iterdir() if f.suffix == ".safetensors" or f.name.endswith("config.json"))
    files += [f for f in [root / RPT_TABLE_NAME] if f.is_file()]  # the offset table, in its subfolder
    return [str(root)] + [(str(f.relative_to(root)), f.stat().st_size, f.stat().st_mtime_ns) for f in files]


def item_id(settings: list, context: list[int], truth: int) -> str:
    """Everything the result depends on: checkpoint, estimator, iterations and the tokens."""
    return hashlib.sha1(json.dumps([settings, context, truth]).encode()).hexdigest()[:20]


def run(args: argparse.Namespace, model, docs: list[list[int]], positions: list[tuple[int, int]],
        store: ResultStore) -> tuple[dict[str, np.ndarray], int]:
    """Per-position arrays ``p`` (``p_k(x_i)`` or its estimate), ``bound`` (certified error) and
    ``coverage``, in position order, resuming from ``store``; also the number computed now."""
    vocab = model.config.vocab_size
    top_m = None if args.exact else min(args.top_m, vocab)
    batch_size = max(1, min(args.batch_size, EXACT_MAX_ELEMENTS // vocab**2)) if top_m is None else args.batch_size
    rule = ptp_rule(args)
    settings = [checkpoint_fingerprint(args.checkpoint), top_m or "exact", args.iters]
    if rule != ea.SAMPLED_PTP:  # the default keeps the keys (and the stored results) of earlier runs
        settings.append([rule.greedy, rule.confidence] + (["unexplored pairs keep x_i"] if rule.confidence > 0 else []))
    items = []
    for d, t in positions:
        context = docs[d][max(0, t - args.context_len):t]
        items.append((item_id(settings, context, docs[d][t]), context, docs[d][t]))
    # Results stored before the proper scores existed lack "sq" / "accept": compute those again.
    todo = [it for it in items if it[0] not in store or "accept" not in store.get(it[0])]
    pad = model.config.pad_token_id or 0
    with tqdm(total=len(items), initial=len(items) - len(todo), desc="error analysis", unit="pos") as bar:
        for lo in range(0, len(todo), batch_size):
            batch = todo[lo:lo + batch_size]
            res = ea.truth_probabilities(model, [c for _, c, _ in batch], [y for _, _, y in batch], iters=args.iters,
                                         top_m=top_m, pad_id=pad, rule=rule)
            for (key, _, _), p, err, cov, sq, acc in zip(batch, res.probs.tolist(), res.bound.tolist(),
                                                         res.coverage.tolist(), res.sq.tolist(), res.accept.tolist()):
                store.add(key, {"p": p, "bound": err, "coverage": cov, "sq": sq, "accept": acc})
            bar.update(len(batch))
    records = [store.get(key) for key, _, _ in items]
    return {f: np.array([r[f] for r in records]) for f in ("p", "bound", "coverage", "sq", "accept")}, len(todo)


def precondition(args: argparse.Namespace, model, docs: list[list[int]], positions: list[tuple[int, int]]) -> dict:
    """The PTP head's loss against the NTP-implied P*'s on the first ``--precondition`` positions
    that have a next token (exact; mean and paired 95% interval of the difference)."""
    chosen = [(d, t) for d, t in positions if t + 1 < len(docs[d])][:args.precondition]
    pad = model.config.pad_token_id or 0
    losses = []
    for lo in range(0, len(chosen), 4):  # V NTP queries per position: small batches
        part = chosen[lo:lo + 4]
        losses.append(ea.ptp_vs_implied(model, [docs[d][max(0, t - args.context_len):t] for d, t in part],
                                        [docs[d][t] for d, t in part], [docs[d][t + 1] for d, t in part], pad_id=pad))
    loss = torch.cat(losses).numpy()
    return {"n_positions": len(loss), "ptp_head_loss": float(loss[:, 0].mean()), "ntp_implied_loss": float(loss[:, 1].mean()),
            "difference": float((loss[:, 0] - loss[:, 1]).mean()),
            "difference_ci": list(ea.bootstrap_ci(loss[:, 0] - loss[:, 1], seed=args.seed)),
            "head_beats_implied": bool(loss[:, 0].mean() < loss[:, 1].mean())}


def ptp_rule(args: argparse.Namespace) -> ea.PTPRule:
    return ea.PTPRule(greedy=args.ptp == "greedy", confidence=args.confidence)


def write_outputs(out: str | Path, summary: dict) -> list[Path]:
    bounds = summary.get("tv_error_bound_by_iters")
    headers = ["k", "eps_k (mean TV)", "95% CI (bootstrap)", "sem"] + (["certified +- (top-m)"] if bounds else [])

    def ci(pair) -> str:
        return f"[{pair[0]:.4f}, {pair[1]:.4f}]"

    rows = [[k, summary["tv_by_iters"][k], ci(summary["tv_ci_by_iters"][k]), summary["tv_sem_by_iters"][k]]
            + ([bounds[k]] if bounds else []) for k in summary["tv_by_iters"]]
    proper = (["k", "log score -log p_k(x_i)", "95% CI", "Brier score", "95% CI"],
              [[k, summary["log_score_by_iters"][k], ci(summary["log_score_ci_by_iters"][k]),
                summary["brier_by_iters"][k], ci(summary["brier_ci_by_iters"][k])] for k in summary.get("brier_by_iters", {})])
    facts = [("n_positions", summary["n_positions"]), ("estimator", summary["estimator_label"]),
             ("PTP step", summary["ptp"]["label"])]
    if "tv_change_1_0" in summary:
        facts += [("eps_1 - eps_0", f"{summary['tv_change_1_0']:+.4f}, 95% CI {ci(summary['tv_change_1_0_ci'])}"
                   + (f", estimator error <= {summary['tv_change_1_0_bound']:.4f}"
                      if "tv_change_1_0_bound" in summary else "")),
                  ("frac_improved (p_1 > p_0)", f"{summary['frac_improved']:.4f}, 95% CI {ci(summary['frac_improved_ci'])}")]
        if "frac_improved_certain" in summary:
            facts.append(("frac_improved within the bound", f"certainly {summary['frac_improved_certain']:.4f}, "
                                                            f"possibly {summary['frac_improved_possible']:.4f}"))
        facts.append(("verdict", summary["tv_change_1_0_verdict"]))
    facts += [(f"coverage {k}", v) for k, v in summary.get("coverage", {}).items()]
    facts += [(f"acceptance rate of the first PTP step, eta = {eta}", v) for eta, v in summary.get("acceptance_by_eta", {}).items()]
    if "precondition" in summary:
        pc = summary["precondition"]
        facts.append(("precondition: PTP head vs NTP-implied P* loss (nats)",
                      f"{pc['ptp_head_loss']:.4f} vs {pc['ntp_implied_loss']:.4f}, difference {pc['difference']:+.4f}, "
                      f"95% CI {ci(pc['difference_ci'])} ({pc['n_positions']} positions, exact)"))
    notes = (f"Checkpoint `{summary['checkpoint']}`, data `{summary['data']}`, contexts of "
             f"{summary['min_context']}..{summary['context_len']} tokens, seed {summary['seed']}. "
             f"eps_k = 1 - p_k(x_i | x_<i) after k RPT iterations (w = 2, {summary['ptp']['label']}); k = 0 is NTP. Intervals: 95% percentile "
             f"bootstrap over positions ({summary['bootstrap']['samples']} resamples); the certified bound is the "
             "top-m estimator's worst-case error of each mean.")
    title = "RPT error analysis (paper Table 2, Fig. 6)"
    return [
        write_json(out, summary),
        write_markdown(sibling(out, ".md"), title, [(headers, rows), proper, (["", "value"], facts)], notes),
        save_figure(ea.plot_histogram(summary, f"RPT (k = 1, {summary['ptp']['label']}) minus NTP, "
                                               f"{summary['estimator_label']}"),
                    sibling(out, ".png")),
    ]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_args(args)
        texts, data_label = load_texts(args)
        model, tokenizer = load_model(args)
        docs = tokenise(texts, tokenizer)
        positions = ea.sample_positions([len(d) for d in docs], args.min_context, args.limit or None, args.seed)
        if not positions:
            raise EvalInputError(f"{data_label}: no position with {args.min_context} tokens of context")
        vocab = model.config.vocab_size
        if max(max(d) for d in docs if d) >= vocab:
            raise EvalInputError("the tokenizer produces ids beyond the model's vocabulary")
        store = ResultStore(args.out, fresh=args.fresh)
    except ValueError as exc:  # EvalInputError, or a corrupt resume file
        print(f"error: {exc}", file=sys.stderr)
        return 2
    label = f"exact (V = {vocab})" if args.exact else (
        f"top-m (m = {min(args.top_m, vocab)} of V = {vocab}"
        + ("; unexplored pairs keep x_i)" if ptp_rule(args).confidence > 0 else ")"))
    print(f"estimator: {label}; {ptp_rule(args).label}; {len(positions)} positions; {args.iters} iterations")
    start = time.perf_counter()
    arrays, computed = run(args, model, docs, positions, store)
    elapsed = time.perf_counter() - start
    summary = {
        "experiment": "error_analysis", "checkpoint": args.checkpoint, "data": data_label,
        "estimator": {"name": "exact"} if args.exact else {"name": "top-m", "m": min(args.top_m, vocab)},
        "estimator_label": label, "window": 2, "iters": args.iters, "min_context": args.min_context,
        "ptp": {"greedy": args.ptp == "greedy", "confidence": args.confidence, "label": ptp_rule(args).label},
        "context_len": args.context_len, "seed": args.seed, "limit": args.limit,
        **(ea.summarise(arrays["p"], seed=args.seed, sq=arrays["sq"], accept=arrays["accept"]) if args.exact else
           ea.summarise(arrays["p"], arrays["bound"], arrays["coverage"], seed=args.seed, sq=arrays["sq"],
                        accept=arrays["accept"])),
    }
    if args.precondition:
        summary["precondition"] = precondition(args, model, docs, positions)
    paths = write_outputs(args.out, summary)
    print(paths[1].read_text(encoding="utf-8"))
    print(f"computed {computed} positions in {elapsed:.1f} s ({computed / max(elapsed, 1e-9):.1f} positions/s), "
          f"{len(positions) - computed} resumed")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
