"""Confidence intervals for a benchmark score: a proportion of ``n`` problems.

The Wilson score interval (Wilson, 1927): unlike the normal ("Wald") interval it stays inside
[0, 1] and is not empty at a score of 0 or 1, which benchmark cells often are. For pass@1 over
several samples per problem the score is a mean of per-problem rates, and the interval treats it
as a proportion of ``n`` problems (the problems, not the samples, are the independent draws).
"""

from __future__ import annotations

import math
from statistics import NormalDist

LEVEL = 0.95
# A convention: below this many problems a cell is a smoke test, not a measurement (at n = 9 and a
# score of 0.5 the 95% interval is 0.23..0.77), and the table says "n too small" instead of an interval.
MIN_N = 10


def wilson(score: float, n: int, level: float = LEVEL) -> tuple[float, float]:
    """The two-sided Wilson score interval of a proportion ``score`` observed on ``n`` trials."""
    if n < 1:
        raise ValueError(f"an interval needs n >= 1 problems, got {n}")
    if not 0.0 <= score <= 1.0:
        raise ValueError(f"score {score} is not a proportion in [0, 1]")
    z = NormalDist().inv_cdf(0.5 + level / 2)
    z2 = z * z
    centre = (score + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(score * (1 - score) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def interval_or_none(score: float, n: int, level: float = LEVEL) -> tuple[float, float] | None:
    """:func:`wilson`, or None when ``n`` is below :data:`MIN_N` ("n too small")."""
    return wilson(score, n, level) if n >= MIN_N else None
