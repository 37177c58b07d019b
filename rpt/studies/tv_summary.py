"""TV to the truth by RPT iteration, summarised: per iteration k its mean and interval over contexts, and
each later iteration's difference from k = 0 (:func:`rpt.statistics.bootstrap_ci`)."""

from __future__ import annotations

import numpy as np

from rpt.statistics import bootstrap_ci


def summarise_tv(tv: np.ndarray, seed: int = 0) -> dict:
    """``tv[S, K, n]`` (seeds, iterations, contexts) -> means, intervals, the k = 1 - k = 0 difference."""
    tv = np.asarray(tv, dtype=np.float64)
    s, k, n = tv.shape
    out = {
        "k": {str(i): {"mean": float(tv[:, i].mean()), "ci95": bootstrap_ci(tv[:, i], seed=seed)} for i in range(k)},
        "tv_by_iters": {str(i): float(tv[:, i].mean()) for i in range(k)},
    }
    for i in range(1, k):
        diff = tv[:, i] - tv[:, 0]
        out[f"diff_{i}_0"] = {"mean": float(diff.mean()), "ci95": bootstrap_ci(diff, seed=seed + i),
                              "frac_contexts_improved": float((diff < 0).mean())}
    if k > 1:
        out["diff_ci95"] = out["diff_1_0"]["ci95"]
    return out
