"""Intervals over evaluation contexts: the percentile bootstrap of a mean, contexts resampled
jointly across training seeds (paired); the two-way bootstrap that resamples the training seeds as
well; and the by-k summary of TV values built from the first."""

from __future__ import annotations

import numpy as np


def bootstrap_ci(values: np.ndarray, resamples: int = 10000, seed: int = 0, level: float = 0.95) -> list[float]:
    """Percentile bootstrap interval of the mean over the last axis; with ``[S, n]`` values (S
    training seeds on the same n contexts) the statistic is the mean over seeds and contexts, the
    contexts resampled jointly (paired across seeds)."""
    values = np.atleast_2d(np.asarray(values, dtype=np.float64))
    n = values.shape[1]
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for lo in range(0, resamples, 1000):
        idx = rng.integers(0, n, size=(min(1000, resamples - lo), n))
        means[lo:lo + len(idx)] = values[:, idx].mean(axis=(0, 2))
    alpha = (1.0 - level) / 2.0
    return [float(np.quantile(means, alpha)), float(np.quantile(means, 1.0 - alpha))]


def seeds_and_contexts_means(values: np.ndarray, resamples: int = 10000, seed: int = 0) -> np.ndarray:
    """The two-way bootstrap's resampled means of ``[S, n]`` values (S training seeds scored on the same
    n contexts, a crossed design): each resample draws S seeds and n contexts with replacement,
    independently, and takes the mean of the S x n values they index."""
    values = np.atleast_2d(np.asarray(values, dtype=np.float64))
    s, n = values.shape
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for lo in range(0, resamples, 1000):
        size = min(1000, resamples - lo)
        rows, cols = rng.integers(0, s, size=(size, s)), rng.integers(0, n, size=(size, n))
        means[lo:lo + size] = values[rows[:, :, None], cols[:, None, :]].mean(axis=(1, 2))  # [size, S, n] drawn
    return means


def bootstrap_ci_seeds_and_contexts(values: np.ndarray, resamples: int = 10000, seed: int = 0,
                                    level: float = 0.95) -> list[float]:
    """Percentile interval of the mean of ``[S, n]`` values over seeds and contexts, both resampled
    (:func:`seeds_and_contexts_means`). With few seeds (5) the percentile interval over seeds is narrower
    than Student's t over them: read it beside the t interval, not instead of it."""
    means = seeds_and_contexts_means(values, resamples, seed)
    alpha = (1.0 - level) / 2.0
    return [float(np.quantile(means, alpha)), float(np.quantile(means, 1.0 - alpha))]


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
