"""Every interval the project reports, at one level (:data:`LEVEL`, 95%) unless a caller asks for another.

* :func:`bootstrap_ci`: the percentile bootstrap of a mean over units (contexts, positions); ``[S, n]``
  values (S training seeds on the same n units) are resampled by unit, paired across the seeds.
* :func:`bootstrap_ci_seeds_and_contexts`: the two-way bootstrap of a crossed ``[S, n]`` design, seeds
  and units both resampled (:func:`seeds_and_contexts_means`).
* :func:`seeds_and_units_means`: the same two-way bootstrap of ratios of sums, several sizes at once
  (the scaling study's quantities), read with :func:`order_statistic_interval`.
* :func:`t_interval`: Student's t interval of a mean over seeds.
* :func:`wilson`: the Wilson score interval of a proportion (Table 1's benchmark scores), and
  :func:`wilson_or_none` below :data:`MIN_N` problems.

Every bootstrap draws its resamples from ``numpy.random.default_rng(seed)`` in a fixed order, so a
seed gives the same interval on every machine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

LEVEL = 0.95
# A convention: below this many problems a benchmark cell is a smoke test, not a measurement (at n = 9 and a
# score of 0.5 the 95% interval is 0.23..0.77), and Table 1 says "n too small" instead of an interval.
MIN_N = 10
CHUNK = 1000  # resamples drawn and averaged at once: bounds the memory of an [S, chunk, n] index


def percentile_interval(replicates: np.ndarray, level: float = LEVEL) -> list[float]:
    """The central ``level`` interval of bootstrap ``replicates`` (linearly interpolated quantiles)."""
    alpha = (1.0 - level) / 2.0
    return [float(np.quantile(replicates, alpha)), float(np.quantile(replicates, 1.0 - alpha))]


def order_statistic_interval(replicates: np.ndarray, level: float = LEVEL) -> list[float]:
    """The central ``level`` interval of ``replicates`` as two of them; ``inf`` counts as larger than any
    finite value."""
    alpha = (1.0 - level) / 2.0
    # inverted_cdf: an order statistic, never an interpolation between two infinite values (nan)
    return [float(np.quantile(replicates, q, method="inverted_cdf")) for q in (alpha, 1.0 - alpha)]


def bootstrap_ci(values: np.ndarray, resamples: int = 10000, seed: int = 0, level: float = LEVEL) -> list[float]:
    """Percentile bootstrap interval of the mean over the last axis (``[nan, nan]`` for fewer than two
    units: one unit has no spread to resample). With ``[S, n]`` values (S training seeds on the same n
    units) the statistic is the mean over seeds and units, the units resampled jointly (paired across
    seeds); a 1-D array is one seed, so paired differences ``a - b`` stay paired."""
    values = np.atleast_2d(np.asarray(values, dtype=np.float64))
    n = values.shape[1]
    if n < 2:
        return [float("nan"), float("nan")]
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for lo in range(0, resamples, CHUNK):
        idx = rng.integers(0, n, size=(min(CHUNK, resamples - lo), n))  # the same draws as one resample at a time
        means[lo:lo + len(idx)] = values[:, idx].mean(axis=(0, 2))
    return percentile_interval(means, level)


def seeds_and_contexts_means(values: np.ndarray, resamples: int = 10000, seed: int = 0) -> np.ndarray:
    """The two-way bootstrap's resampled means of ``[S, n]`` values (S training seeds scored on the same
    n contexts, a crossed design): each resample draws S seeds and n contexts with replacement,
    independently, and takes the mean of the S x n values they index."""
    values = np.atleast_2d(np.asarray(values, dtype=np.float64))
    s, n = values.shape
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for lo in range(0, resamples, CHUNK):
        size = min(CHUNK, resamples - lo)
        rows, cols = rng.integers(0, s, size=(size, s)), rng.integers(0, n, size=(size, n))
        means[lo:lo + size] = values[rows[:, :, None], cols[:, None, :]].mean(axis=(1, 2))  # [size, S, n] drawn
    return means


def bootstrap_ci_seeds_and_contexts(values: np.ndarray, resamples: int = 10000, seed: int = 0,
                                    level: float = LEVEL) -> list[float]:
    """Percentile interval of the mean of ``[S, n]`` values over seeds and contexts, both resampled
    (:func:`seeds_and_contexts_means`). With few seeds (5) the percentile interval over seeds is narrower
    than Student's t over them: read it beside the t interval, not instead of it."""
    return percentile_interval(seeds_and_contexts_means(values, resamples, seed), level)


def seeds_and_units_means(sizes: Sequence[tuple[np.ndarray, np.ndarray]], resamples: int, seed: int) -> np.ndarray:
    """``[resamples, len(sizes)]``: per size, the mean over drawn seeds of a ratio of sums ``sum num /
    sum den`` over drawn units (``den = 1``: a mean). ``sizes`` holds one ``(num, den)`` pair of ``[S, n]``
    arrays per size; one replicate draws, per size, the seeds with replacement and the units with
    replacement (the same units for every seed: they are the same positions)."""
    rng = np.random.default_rng(seed)
    out = np.empty((resamples, len(sizes)))
    for j, (num, den) in enumerate(sizes):
        s, n = num.shape
        seeds = rng.integers(0, s, size=(resamples, s))
        units = rng.integers(0, n, size=(resamples, n))
        drawn_num = num[:, units].sum(axis=2)  # [s, resamples]: every seed on the drawn units
        drawn_den = den[:, units].sum(axis=2)
        ratio = (drawn_num / drawn_den).T  # [resamples, s]
        out[:, j] = np.take_along_axis(ratio, seeds, axis=1).mean(axis=1)
    return out


def t_interval(values: Sequence[float], level: float = LEVEL) -> list[float] | None:
    """Student's t interval of the mean of ``values``, ``mean +- t(S - 1) sd / sqrt(S)`` (None for fewer
    than two)."""
    from scipy.stats import t

    x = np.asarray(values, dtype=np.float64)
    if len(x) < 2:
        return None
    half = float(t.ppf(0.5 + level / 2, len(x) - 1)) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return [float(x.mean()) - half, float(x.mean()) + half]


def wilson(score: float, n: int, level: float = LEVEL) -> tuple[float, float]:
    """The two-sided Wilson score interval (Wilson, 1927) of a proportion ``score`` observed on ``n``
    trials: unlike the normal ("Wald") interval it stays inside [0, 1] and is not empty at a score of 0
    or 1. A pass@1 averaged over several samples per problem is treated as a proportion of ``n``
    problems (the problems, not the samples, are the independent draws)."""
    if n < 1:
        raise ValueError(f"an interval needs n >= 1 problems, got {n}")
    if not 0.0 <= score <= 1.0:
        raise ValueError(f"score {score} is not a proportion in [0, 1]")
    z = NormalDist().inv_cdf(0.5 + level / 2)
    z2 = z * z
    centre = (score + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(score * (1 - score) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def wilson_or_none(score: float, n: int, level: float = LEVEL) -> tuple[float, float] | None:
    """:func:`wilson`, or None when ``n`` is below :data:`MIN_N` ("n too small")."""
    return wilson(score, n, level) if n >= MIN_N else None
