"""The project's intervals (rpt/statistics.py) against independent truths: normal theory on large samples,
the exact bootstrap distribution by enumeration on tiny ones, Student's t and Wilson's tables, exact
binomial coverage, and the crossed design's variance formula."""

from __future__ import annotations

import itertools
import math
from statistics import NormalDist

import numpy as np
import pytest

from rpt import statistics as st


# ---- the bootstrap of a mean -----------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1])
def test_bootstrap_interval_matches_the_normal_one_on_a_large_sample(seed):
    """n = 4000 normal draws: the 95% interval is mean +- 1.96 sd / sqrt(n) to within the bootstrap's
    own noise (a Bernoulli sample too: p +- 1.96 sqrt(p (1 - p) / n))."""
    rng = np.random.default_rng(seed)
    x = rng.normal(1.0, 2.0, size=4000)
    lo, hi = st.bootstrap_ci(x, resamples=4000, seed=1)
    half = 1.96 * x.std(ddof=1) / math.sqrt(len(x))
    assert lo == pytest.approx(x.mean() - half, abs=0.1 * half) and hi == pytest.approx(x.mean() + half, abs=0.1 * half)
    b = (rng.random(4000) < 0.3).astype(float)
    lo, hi = st.bootstrap_ci(b, 2000, seed=2)
    half = 1.96 * math.sqrt(b.mean() * (1 - b.mean()) / len(b))
    assert lo == pytest.approx(b.mean() - half, abs=0.004) and hi == pytest.approx(b.mean() + half, abs=0.004)


def test_bootstrap_quantiles_match_the_enumerated_bootstrap_distribution():
    """Three values: all 27 equally likely resamples enumerated give the bootstrap distribution of the
    mean exactly; 40,000 resamples put each end of the interval on (or between) the atoms next to the
    exact 2.5% and 97.5% quantiles."""
    x = np.array([0.0, 1.0, 5.0])
    means = np.sort([x[list(idx)].mean() for idx in itertools.product(range(3), repeat=3)])
    cdf = np.arange(1, 28) / 27
    exact = means[np.searchsorted(cdf, 0.025)], means[np.searchsorted(cdf, 0.975)]
    lo, hi = st.bootstrap_ci(x, resamples=40000, seed=3)
    gap = np.diff(np.unique(means)).max()
    assert lo == pytest.approx(exact[0], abs=gap) and hi == pytest.approx(exact[1], abs=gap)
    assert means[0] <= lo <= hi <= means[-1]


def test_seeds_are_paired_by_unit_and_one_unit_has_no_interval():
    """[S, n]: the statistic is the mean over seeds and units, units drawn once for every seed (a row
    shifted by a constant moves the interval by half the shift with two seeds); a difference constant
    over units has a point interval; fewer than two units give nan."""
    rng = np.random.default_rng(4)
    row = rng.random(200)
    base = st.bootstrap_ci(np.stack([row, row]), 2000, seed=5)
    shifted = st.bootstrap_ci(np.stack([row, row + 1.0]), 2000, seed=5)
    assert shifted == pytest.approx([base[0] + 0.5, base[1] + 0.5])
    assert st.bootstrap_ci(np.full(50, -0.01), 500) == pytest.approx([-0.01, -0.01])
    assert all(math.isnan(v) for v in st.bootstrap_ci([0.3], 100))


def test_resamples_drawn_in_chunks_equal_resamples_drawn_one_at_a_time():
    """The chunked draws are the same numbers as one resample at a time from the same generator, so the
    interval is the loop's to the last digit (the error analysis's intervals were computed that way)."""
    rng = np.random.default_rng(6)
    for n in (2, 7, 333, 1001):
        x = rng.standard_normal(n)
        draw = np.random.default_rng(9)
        loop = np.array([x[draw.integers(0, n, n)].mean() for _ in range(2500)])
        assert st.bootstrap_ci(x, 2500, seed=9) == st.percentile_interval(loop)


# ---- the two-way bootstraps ------------------------------------------------------------------------------
def test_two_way_bootstrap_variance_matches_the_crossed_design_formula():
    """The two-way bootstrap's resampled means of x[s, c] = mu + a_s + b_c + e_sc (S seeds crossed with n
    contexts) have variance var(a) / S + var(b) / n + var(e) / (S n), the population variances of the
    two-way decomposition's parts (derived by hand: the drawn seeds and contexts are independent, and
    e sums to 0 over each row and column). 40,000 resamples: a variance to about 1% (sd sqrt(2 / R))."""
    rng = np.random.default_rng(1)
    s, n = 5, 60
    x = 0.1 + rng.normal(0, 0.02, (s, 1)) + rng.normal(0, 0.05, (1, n)) + rng.normal(0, 0.03, (s, n))
    a = x.mean(axis=1) - x.mean()
    b = x.mean(axis=0) - x.mean()
    e = x - x.mean() - a[:, None] - b[None, :]
    exact = (a ** 2).mean() / s + (b ** 2).mean() / n + (e ** 2).mean() / (s * n)
    means = st.seeds_and_contexts_means(x, resamples=40000, seed=2)
    assert means.mean() == pytest.approx(x.mean(), abs=4 * math.sqrt(exact / 40000))
    assert means.var() == pytest.approx(exact, rel=0.04)
    lo, hi = st.bootstrap_ci_seeds_and_contexts(x, resamples=40000, seed=2)
    assert [lo, hi] == pytest.approx(list(np.quantile(means, [0.025, 0.975])))
    # one seed: only the contexts vary, as in the contexts-only bootstrap
    one = st.seeds_and_contexts_means(x[:1], resamples=40000, seed=3)
    assert one.var() == pytest.approx(x[0].var() / n, rel=0.04)


def test_seeds_and_units_means_spread_is_the_standard_error_and_ratios_weight_tokens():
    rng = np.random.default_rng(1)
    values = rng.normal(0.0, 1.0, size=(1, 400))
    reps = st.seeds_and_units_means([(values, np.ones_like(values))], 4000, seed=2)
    assert reps.std() == pytest.approx(values.std() / math.sqrt(400), rel=0.1)  # bootstrap SE of a mean
    assert reps.mean() == pytest.approx(values.mean(), abs=0.01)
    # a ratio of sums: units with more tokens weigh more; one unit drawn twice is the same ratio
    num, den = np.array([[10.0, 1.0]]), np.array([[5.0, 1.0]])
    reps = st.seeds_and_units_means([(num, den)], 2000, seed=3)
    assert set(np.round(reps[:, 0], 12)) <= {2.0, 1.0, round(11.0 / 6.0, 12)}


def test_order_statistic_interval_keeps_infinite_replicates():
    values = np.array([1.0, 2.0, 3.0] + [np.inf] * 97)
    lo, hi = st.order_statistic_interval(values)
    # the 2.5% point of 100 values: the 3rd smallest, the first with F >= 0.025; the top one inf, never nan
    assert lo == 3.0 and hi == np.inf


# ---- Student's t -----------------------------------------------------------------------------------------
def test_t_interval_by_hand():
    # values 1 and 3: mean 2, sd sqrt(2), standard error 1, t(0.975, df 1) = 12.7062 (tables)
    lo, hi = st.t_interval([1.0, 3.0])
    assert lo == pytest.approx(2 - 12.7062047, abs=1e-6) and hi == pytest.approx(2 + 12.7062047, abs=1e-6)
    # three values: t(0.975, df 2) = 4.3027
    x = [0.1, 0.2, 0.4]
    half = 4.30265273 * np.std(x, ddof=1) / np.sqrt(3)
    assert st.t_interval(x) == pytest.approx([np.mean(x) - half, np.mean(x) + half], abs=1e-7)
    assert st.t_interval([0.5]) is None


# ---- Wilson ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("successes, n, low, high", [
    # Newcombe (1998), Statistics in Medicine 17:857, Table I, method 3 (Wilson score, no continuity correction)
    (81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0000, 0.1611), (1, 29, 0.0061, 0.1718)])
def test_wilson_interval_equals_published_values(successes, n, low, high):
    got = st.wilson(successes / n, n)
    assert got == (pytest.approx(low, abs=5e-5), pytest.approx(high, abs=5e-5))


@pytest.mark.parametrize("score, n", [(0.0, 10), (0.3, 17), (0.5, 164), (0.97, 378), (1.0, 40), (0.625, 1319)])
def test_wilson_interval_is_where_the_score_test_accepts(score, n):
    """Brute force: the Wilson interval is the set of p with |score - p| <= z sqrt(p (1 - p) / n);
    its ends found by bisection on that inequality, not by the closed form."""
    z = NormalDist().inv_cdf(0.975)

    def accepted(p: float) -> bool:
        return abs(score - p) <= z * math.sqrt(p * (1 - p) / n)

    def edge(inside: float, outside: float) -> float:
        for _ in range(100):
            mid = (inside + outside) / 2
            inside, outside = (mid, outside) if accepted(mid) else (inside, mid)
        return inside

    centre = min(max(score, 1e-12), 1 - 1e-12)  # the score itself is always accepted (p strictly inside (0, 1))
    low = 0.0 if accepted(0.0) or score == 0.0 else edge(centre, 0.0)
    high = 1.0 if accepted(1.0) or score == 1.0 else edge(centre, 1.0)
    assert st.wilson(score, n) == (pytest.approx(low, abs=1e-9), pytest.approx(high, abs=1e-9))


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_wilson_coverage_by_enumerating_every_outcome(p):
    """Exact coverage at n = 40: the binomial probability of the outcomes whose interval contains p.
    Wilson's interval is known to stay near its nominal 95% (Brown, Cai & DasGupta 2001, Fig. 4: within
    about 0.93-0.98 at this n), where the Wald interval falls far below at p = 0.1."""
    n = 40
    pmf = [math.comb(n, k) * p ** k * (1 - p) ** (n - k) for k in range(n + 1)]
    covered = sum(w for k, w in enumerate(pmf) if st.wilson(k / n, n)[0] <= p <= st.wilson(k / n, n)[1])
    assert 0.93 <= covered <= 0.98


def test_wilson_needs_enough_problems():
    assert st.wilson_or_none(0.5, st.MIN_N - 1) is None
    assert st.wilson_or_none(0.5, st.MIN_N) == st.wilson(0.5, st.MIN_N)
    with pytest.raises(ValueError, match="n >= 1"):
        st.wilson(0.5, 0)
    with pytest.raises(ValueError, match="not a proportion"):
        st.wilson(1.5, 20)
