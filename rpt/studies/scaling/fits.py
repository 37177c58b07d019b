"""Trends against parameter count and their intervals: the two functional forms the scaling study
fits, the crossover of a trend through zero, and the quantities the bootstrap over seeds and positions
resamples.

Forms (``x = log10 N``):

* **log-linear** ``y = a + b x`` (least squares, closed form);
* **power law with an offset** ``y = c + k N^(-alpha)`` (``alpha > 0``; nonlinear least squares
  from a grid of starting exponents; None when it does not converge).

The **crossover** of a log-linear trend is where it passes zero going down: ``x* = -a / b`` when
``b < 0``; with ``b >= 0`` the trend never turns negative as N grows and there is none (``inf``).

**Bootstrap over seeds and positions** (:func:`rpt.statistics.seeds_and_units_means`): a quantity
is measured per model on units (positions, or validation batches) shared by every model, as a ratio
of sums ``sum num / sum den`` (``den = 1``: a mean), held per size as a :class:`Measured`. One replicate
draws, per size, the seeds with replacement and the units with replacement (the same units for every
model: the positions are the same positions) and recomputes the per-size mean over the drawn seeds;
its intervals are order statistics of the replicates (:func:`rpt.statistics.order_statistic_interval`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rpt.statistics import order_statistic_interval


def log_linear(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least-squares ``(a, b)`` of ``y = a + b x``; ``y`` may be ``[..., n]`` (one fit per row)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    xc = x - x.mean()
    b = (y * xc).sum(axis=-1) / (xc * xc).sum()
    a = y.mean(axis=-1) - b * x.mean()
    return np.stack([a, b], axis=-1)


def crossover(ab: np.ndarray) -> np.ndarray:
    """``x*`` where ``a + b x`` passes zero going down (``b < 0``), else ``inf``; ``ab``: ``[..., 2]``."""
    ab = np.asarray(ab, dtype=np.float64)
    a, b = ab[..., 0], ab[..., 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b < 0, -a / np.where(b < 0, b, -1.0), np.inf)


def power_offset(n: np.ndarray, y: np.ndarray) -> dict | None:
    """``y = c + k N^(-alpha)`` by least squares, ``alpha`` in [0.01, 3]: for a fixed ``alpha`` the
    model is linear in ``(c, k)`` (solved exactly), so only ``alpha`` is searched (a grid, then a
    bounded scalar minimisation around the best point). None with fewer than three sizes.
    Returns ``c``, ``k``, ``alpha`` and the residual sum of squares."""
    from scipy.optimize import minimize_scalar

    n = np.asarray(n, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if len(n) < 3:
        return None
    u = n / n.min()  # N / N_min: the columns stay of order one

    def solve(alpha: float) -> tuple[float, np.ndarray]:
        design = np.stack([np.ones_like(u), u ** (-alpha)], axis=1)
        coef = np.linalg.lstsq(design, y, rcond=None)[0]
        return float(((design @ coef - y) ** 2).sum()), coef

    grid = np.linspace(0.01, 3.0, 60)
    i = int(np.argmin([solve(a)[0] for a in grid]))
    res = minimize_scalar(lambda a: solve(a)[0], bounds=(grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]),
                          method="bounded")
    alpha = float(res.x)
    rss, (c, k) = solve(alpha)
    return {"c": float(c), "k": float(k) * n.min() ** alpha, "alpha": alpha, "rss": rss}


def power_offset_value(fit: dict, n) -> np.ndarray:
    return fit["c"] + fit["k"] * np.asarray(n, dtype=np.float64) ** (-fit["alpha"])


@dataclass
class Measured:
    """One quantity of one size: per seed, ``num[n]`` and ``den[n]`` over the shared units."""

    num: np.ndarray  # [seeds, n]
    den: np.ndarray  # [seeds, n]

    @classmethod
    def of_means(cls, values: Sequence[Sequence[float]]) -> Measured:
        v = np.asarray(values, dtype=np.float64)
        return cls(v, np.ones_like(v))

    def per_seed(self) -> np.ndarray:
        return self.num.sum(axis=1) / self.den.sum(axis=1)

    def mean(self) -> float:
        return float(self.per_seed().mean())


def crossover_summary(log_n: np.ndarray, means: np.ndarray, reps: np.ndarray) -> dict:
    """The log-linear fit of the per-size means, its crossover ``N*`` with a bootstrap interval, and
    where the crossover lies against the measured range."""
    ab = log_linear(log_n, means)
    x = float(crossover(ab))
    rep_x = crossover(log_linear(log_n, reps))
    lo, hi = order_statistic_interval(rep_x)
    return {"form": "log-linear: y = a + b log10 N", "a": float(ab[0]), "b": float(ab[1]),
            "b_ci95": order_statistic_interval(log_linear(log_n, reps)[:, 1]),
            "log10_crossover": x if math.isfinite(x) else None,
            "crossover_parameters": 10.0 ** x if math.isfinite(x) and x < 300 else None,
            "log10_crossover_ci95": [lo if math.isfinite(lo) else None, hi if math.isfinite(hi) else None],
            "share_no_crossover": float(np.mean(~np.isfinite(rep_x))),
            "where": _where(x, log_n)}


def _where(x: float, log_n: np.ndarray) -> str:
    if not math.isfinite(x):
        return "none: the fitted trend does not turn negative as N grows"
    if x < log_n.min():
        return "below the smallest size: the trend says RPT already helps at every measured size"
    if x <= log_n.max():
        return "inside the measured range"
    return "above the largest size (an extrapolation)"


def leave_largest_out(log_n: np.ndarray, means: np.ndarray, reps: np.ndarray) -> dict:
    """The log-linear fit on all sizes but the largest, its prediction at the largest, and the
    bootstrap interval of observed minus predicted (the same replicates for both): **held** when
    that interval contains 0."""
    pred = float(log_linear(log_n[:-1], means[:-1]) @ [1.0, log_n[-1]])
    rep_pred = log_linear(log_n[:-1], reps[:, :-1]) @ np.array([1.0, log_n[-1]])
    diff = reps[:, -1] - rep_pred
    ci = order_statistic_interval(diff)
    return {"predicted": pred, "predicted_ci95": order_statistic_interval(rep_pred), "observed": float(means[-1]),
            "observed_minus_predicted": float(means[-1] - pred), "difference_ci95": ci,
            "held": bool(ci[0] <= 0.0 <= ci[1])}
