"""Loss differences with intervals over training seeds and over validation batches.

A difference of 0.01-0.05 nats between two fine-tunes from one training seed is inside the
seed-to-seed spread, so the demo trains each arm with several seeds and reports, for each compared
pair (e.g. RPT's NTP loss minus AR-F's, or RPT's PTP-1 minus its NTP):

* ``per_seed``: the difference of seed s's two runs (arms paired by seed: the same data order);
* ``ci95_seeds``: Student's t interval of the mean over seeds (:func:`rpt.statistics.t_interval`):
  what another set of training seeds would give (with 2 seeds t = 12.7: only a consistent
  difference resolves);
* ``ci95_batches``: a paired percentile bootstrap over the validation batches (every run scores
  the same batches, ``eval_batches.json``), the seeds' mean recomputed per resample: what another
  validation set would give, with these training runs fixed;
* ``observed_sign``: the sign of the mean when **both** intervals exclude 0, else 0.

Inputs are the per-batch CE sums and target counts the trainer writes after its last evaluation
(:func:`rpt.training.validation.evaluate`), so every number is a token-weighted mean as the logged losses are.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rpt.statistics import percentile_interval, t_interval

KINDS = {"ntp": 0, "ptp_1": 1}


def read_batches(run_dir: str | Path) -> dict:
    """``<run_dir>/eval_batches.json`` as arrays: ``batch [n]``, ``sum [n, kinds]``, ``count [n, kinds]``."""
    path = Path(run_dir) / "eval_batches.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: it is written by train.py's evaluation (rerun the training "
                                "stage with a validation split, eval_batches > 0)")
    raw = json.loads(path.read_text())
    return {"step": raw["step"], "batch": np.asarray(raw["batch"]),
            "sum": np.asarray(raw["sum"], dtype=np.float64), "count": np.asarray(raw["count"], dtype=np.float64)}


def mean_loss(batches: dict, kind: str) -> float:
    """The run's token-weighted mean loss of ``kind`` ("ntp" or "ptp_1"), as its metrics log it."""
    k = KINDS[kind]
    return float(batches["sum"][:, k].sum() / batches["count"][:, k].sum())


def _paired(a: dict, b: dict) -> None:
    if not np.array_equal(a["batch"], b["batch"]) or not np.array_equal(a["count"][:, 0], b["count"][:, 0]):
        raise ValueError("the compared runs were not evaluated on the same validation batches (different "
                         "tokenizer, seq_len or eval_batches): their differences are not paired")


def batch_interval(pairs: Sequence[tuple[dict, str, dict, str]], resamples: int = 4000, seed: int = 0,
                   level: float = 0.95) -> list[float]:
    """Percentile bootstrap over validation batches of the mean over seeds of ``loss(b, kb) - loss(a, ka)``;
    ``pairs`` holds one ``(a, ka, b, kb)`` per seed, all on the same batches (resampled jointly)."""
    for a, _, b, _ in pairs:
        _paired(pairs[0][0], a)
        _paired(a, b)
    n = len(pairs[0][0]["batch"])
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    diffs = np.zeros(resamples)
    for a, ka, b, kb in pairs:
        ia, ib = KINDS[ka], KINDS[kb]

        def resampled(run, k):
            return run["sum"][idx, k].sum(1) / run["count"][idx, k].sum(1)
        diffs += resampled(b, ib) - resampled(a, ia)
    diffs /= len(pairs)
    return percentile_interval(diffs, level)


def compare(a_runs: Sequence[dict], a_kind: str, b_runs: Sequence[dict], b_kind: str) -> dict:
    """``b_kind`` loss of ``b_runs[s]`` minus ``a_kind`` loss of ``a_runs[s]``, seeds paired by index."""
    if len(a_runs) != len(b_runs) or not a_runs:
        raise ValueError(f"compare needs the same number (>= 1) of runs per arm, got {len(a_runs)} and {len(b_runs)}")
    per_seed = [mean_loss(b, b_kind) - mean_loss(a, a_kind) for a, b in zip(a_runs, b_runs)]
    seeds_ci = t_interval(per_seed)
    batches_ci = batch_interval([(a, a_kind, b, b_kind) for a, b in zip(a_runs, b_runs)])
    excludes = [ci is not None and (ci[0] > 0 or ci[1] < 0) for ci in (seeds_ci, batches_ci)]
    mean = float(np.mean(per_seed))
    return {"per_seed": per_seed, "mean": mean, "ci95_seeds": seeds_ci, "ci95_batches": batches_ci,
            "observed_sign": int(np.sign(mean)) if all(excludes) else 0}


def seed_study(arms: dict[str, Sequence[str | Path]], seeds: Sequence[int]) -> dict:
    """The demo's seed study: ``arms`` maps "ar_f" and "rpt" to their run directories, one per seed."""
    runs = {name: [read_batches(d) for d in dirs] for name, dirs in arms.items()}
    return {
        "seeds": list(seeds),
        "losses": {"ar_f_ntp": [mean_loss(r, "ntp") for r in runs["ar_f"]],
                   "rpt_ntp": [mean_loss(r, "ntp") for r in runs["rpt"]],
                   "rpt_ptp_1": [mean_loss(r, "ptp_1") for r in runs["rpt"]]},
        # RPT's NTP loss minus AR-F's: the "NTP barely changes" claim
        "ntp_gap": compare(runs["ar_f"], "ntp", runs["rpt"], "ntp"),
        # RPT's PTP-1 loss minus its own NTP loss: is the previous token easier to predict?
        "ptp1_minus_ntp": compare(runs["rpt"], "ntp", runs["rpt"], "ptp_1"),
    }
