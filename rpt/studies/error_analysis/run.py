"""One error-analysis run (``eval/error_analysis.py``): the text and the checkpoint loaded, the
positions sampled and resumed from the result store, Table 2 and Fig. 6 written.

The estimators themselves are :mod:`rpt.studies.error_analysis.analysis`; this module drives them over a
checkpoint's validation positions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from rpt.checkpoint.model_ref import ModelRefError, resolve_model_ref
from rpt.cli.parser import report_input_error
from rpt.evaluation.batched_generation import load_checkpoint
from rpt.evaluation.sweep import hub_snapshot
from rpt.evaluation.user_jsonl import EvalInputError, read_jsonl
from rpt.model.wrapper import RPT_CONFIG_NAME, RPT_TABLE_NAME
from rpt.result_files import ResultStore, save_figure, sibling, write_json, write_markdown
from rpt.statistics import bootstrap_ci
from rpt.studies.error_analysis import analysis as ea

# Exact mode holds two [batch, V, V] float64 matrices; cap their size at about 1 GB.
EXACT_MAX_ELEMENTS = 2**26


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
        try:
            return [path.read_text(encoding="utf-8")], args.text_file
        except UnicodeDecodeError as exc:
            raise EvalInputError(f"{path}: not UTF-8 text (byte {exc.start + 1}); save the file as UTF-8") from None
    from rpt.data import stdlib_texts  # late: datasets and the tokenizer stack, only for the default text

    return stdlib_texts("validation", args.val_fraction), f"stdlib:validation:{args.val_fraction:g}"


def load_model(args: argparse.Namespace):
    """Model and tokenizer (:func:`~rpt.evaluation.batched_generation.load_checkpoint`, float32); every
    failure becomes an :class:`EvalInputError`. ``args.checkpoint`` becomes the resolved path."""
    try:
        args.checkpoint = resolve_model_ref(args.checkpoint, "--checkpoint", "train one first or check the path")
    except ModelRefError as e:
        raise EvalInputError(str(e)) from None
    try:
        model, tokenizer, window = load_checkpoint(args.checkpoint, args.device)
    except (OSError, ValueError) as exc:
        raise EvalInputError(f"{args.checkpoint}: cannot load the RPT checkpoint and tokenizer ({exc})") from None
    if window is None:
        raise EvalInputError(f"{args.checkpoint}: cannot load the RPT checkpoint and tokenizer (it is a plain causal LM, "
                             f"no {RPT_CONFIG_NAME}); the error analysis needs a model fine-tuned with RPT")
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
    directory must not reuse stale results. A hub id is the snapshot the local cache resolves it to
    (its directory names the commit): a model updated in the cache does not reuse the old one's."""
    local = Path(path).expanduser()
    root = (local if local.is_dir() else Path(hub_snapshot(path) or local)).resolve()
    if not root.is_dir():
        return [path]
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
            "difference_ci": bootstrap_ci(loss[:, 0] - loss[:, 1], ea.BOOTSTRAP_SAMPLES, args.seed),
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


def run_error_analysis(args: argparse.Namespace) -> int:
    """The whole run for the parsed and checked arguments of ``eval/error_analysis.py``: prints the
    table and writes ``F.json``, ``F.md``, ``F.png``; bad input is one ``error:`` line and 2."""
    try:
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
        return report_input_error(exc, traceback_hint=False)
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
