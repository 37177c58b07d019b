"""The synthetic NTP-vs-RPT sampling experiment of the RPT paper (Sec. 3, Fig. 4, App. A.3).

Per trial, with vocabulary size V:

* ground truth: a joint ``pi(x_i, x_{i+1})`` with i.i.d. U(0, 1) entries, normalised; its
  marginal ``pi_i``, next-token conditional ``pi_{i+1|i}`` and previous-token conditional
  ``pi_{i|i+1}``;
* learned (noisy) versions ``(1 - eps) * p + eps * n`` (eq. 33), with a fresh random
  distribution ``n`` (U(0, 1) entries, normalised) for the marginal and for every row of each
  conditional: noise ``eps_n`` for the NTP marginal and conditional, ``eps_p`` for the PTP one;
* NTP joint: ``hat_pi_i(a) * hat_pi_{i+1|i}(b|a)`` (eq. 22);
* RPT joint: the exact stationary distribution of the kernel
  ``p(a', b' | a, b) = hat_pi_{i|i+1}(a'|b) hat_pi_{i+1|i}(b'|a')`` (eq. 27). That kernel only
  looks at ``b``, so its stationary law is ``rho(a) hat_pi_{i+1|i}(b|a)`` where ``rho`` is the
  stationary law of the V-state chain ``Q = hat_pi_{i+1|i} @ hat_pi_{i|i+1}`` on ``x_i``;
  solving the V x V system instead of the V^2 x V^2 one is exact (tests check both agree);
* errors against ``pi``: total variation ``0.5 * sum |hat - pi|`` and the max-norm of the joint
  error, ``max |hat - pi|`` over the V^2 pairs (the vector infinity norm; Fig. 4 top row).

All cases of a trial share the same ground truth and noise draws (common random numbers), so
the NTP error of a trial is the same in the three cases and the comparison is paired.
``frac_rpt_better`` is the fraction of trials with a smaller RPT TV error. Everything is
vectorised over trials (batched ``numpy.linalg.solve``), so 1000 trials take well under a second.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure

VOCAB = 20
MAIN_EPS_N = 1.0
APPENDIX_EPS_N = (0.1, 0.01)
# (name, eps_p / eps_n): the paper's oracle, medium and low cases.
CASES: tuple[tuple[str, float], ...] = (("oracle", 0.0), ("medium", 0.5), ("low", 0.75))


@dataclass(frozen=True)
class Draws:
    """One batch of trials: the ground-truth joints and the noise distributions."""

    pi: np.ndarray  # (T, V, V) joint over (x_i, x_{i+1})
    noise_marginal: np.ndarray  # (T, V)
    noise_next: np.ndarray  # (T, V, V), row a: a distribution over x_{i+1}
    noise_prev: np.ndarray  # (T, V, V), row b: a distribution over x_i


def _random_distributions(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    x = rng.uniform(0.0, 1.0, size=shape)
    return x / x.sum(axis=-1, keepdims=True)


def draw(trials: int, vocab: int = VOCAB, seed: int = 0) -> Draws:
    """Sample ``trials`` ground truths and their noise distributions."""
    rng = np.random.default_rng(seed)
    pi = _random_distributions(rng, (trials, vocab * vocab)).reshape(trials, vocab, vocab)
    return Draws(
        pi=pi,
        noise_marginal=_random_distributions(rng, (trials, vocab)),
        noise_next=_random_distributions(rng, (trials, vocab, vocab)),
        noise_prev=_random_distributions(rng, (trials, vocab, vocab)),
    )


def conditionals(pi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Marginal ``pi_i`` (T, V), next ``N[a, b] = pi(b|a)`` and previous ``P[b, a] = pi(a|b)``."""
    marginal = pi.sum(axis=2)
    following = pi.sum(axis=1)
    next_cond = pi / marginal[:, :, None]
    prev_cond = np.swapaxes(pi, 1, 2) / following[:, :, None]
    return marginal, next_cond, prev_cond


def stationary(transition: np.ndarray) -> np.ndarray:
    """Stationary distributions of a batch of row-stochastic (T, S, S) matrices (unique: positive)."""
    t, s, _ = transition.shape
    system = np.swapaxes(transition, 1, 2) - np.eye(s)  # (Q^T - I) rho = 0 ...
    system[:, -1, :] = 1.0  # ... with one redundant equation replaced by sum(rho) = 1
    rhs = np.zeros((t, s, 1))
    rhs[:, -1, 0] = 1.0
    rho = np.linalg.solve(system, rhs)[:, :, 0]
    return rho / rho.sum(axis=1, keepdims=True)


def ntp_joint(marginal: np.ndarray, next_cond: np.ndarray) -> np.ndarray:
    """Eq. 22: the joint NTP samples from."""
    return marginal[:, :, None] * next_cond


def rpt_joint(next_cond: np.ndarray, prev_cond: np.ndarray) -> np.ndarray:
    """Exact stationary joint of the RPT kernel (eq. 27) built from the given conditionals."""
    rho = stationary(next_cond @ prev_cond)
    return rho[:, :, None] * next_cond


def rpt_kernel(next_cond: np.ndarray, prev_cond: np.ndarray) -> np.ndarray:
    """The full (T, V^2, V^2) kernel of eq. 27, state index ``a * V + b`` (for tests, small V)."""
    t, v, _ = next_cond.shape
    # kernel[(a, b), (a2, b2)] = P[b, a2] * N[a2, b2], independent of a.
    per_b = prev_cond[:, :, :, None] * next_cond[:, None, :, :]  # (T, b, a2, b2)
    kernel = np.broadcast_to(per_b[:, None], (t, v, v, v, v))
    return kernel.reshape(t, v * v, v * v)


def errors(joint: np.ndarray, pi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-trial total-variation and max-norm errors of ``joint`` against ``pi``."""
    diff = np.abs(joint - pi).reshape(len(pi), -1)
    return 0.5 * diff.sum(axis=1), diff.max(axis=1)


def noisy(clean: np.ndarray, noise: np.ndarray, eps: float) -> np.ndarray:
    """Eq. 33: ``(1 - eps) * clean + eps * noise``."""
    return (1.0 - eps) * clean + eps * noise


@dataclass(frozen=True)
class CaseResult:
    """Per-trial errors of one (eps_n, eps_p) setting."""

    name: str
    eps_n: float
    eps_p: float
    tv_ntp: np.ndarray
    tv_rpt: np.ndarray
    max_ntp: np.ndarray
    max_rpt: np.ndarray

    def summary(self) -> dict:
        """This setting's JSON object: means and the fraction of trials RPT wins (TV)."""
        return {
            "name": self.name,
            "eps_n": self.eps_n,
            "eps_p": self.eps_p,
            "tv_ntp_mean": float(self.tv_ntp.mean()),
            "tv_rpt_mean": float(self.tv_rpt.mean()),
            "max_ntp_mean": float(self.max_ntp.mean()),
            "max_rpt_mean": float(self.max_rpt.mean()),
            "frac_rpt_better": float((self.tv_rpt < self.tv_ntp).mean()),
        }


def run_case(draws: Draws, name: str, eps_n: float, eps_p: float) -> CaseResult:
    """NTP and RPT errors of every trial in ``draws`` at one noise setting."""
    marginal, next_cond, prev_cond = conditionals(draws.pi)
    hat_marginal = noisy(marginal, draws.noise_marginal, eps_n)
    hat_next = noisy(next_cond, draws.noise_next, eps_n)
    hat_prev = noisy(prev_cond, draws.noise_prev, eps_p)
    tv_ntp, max_ntp = errors(ntp_joint(hat_marginal, hat_next), draws.pi)
    tv_rpt, max_rpt = errors(rpt_joint(hat_next, hat_prev), draws.pi)
    return CaseResult(name, eps_n, eps_p, tv_ntp, tv_rpt, max_ntp, max_rpt)


def run_noise_level(draws: Draws, eps_n: float) -> list[CaseResult]:
    """The oracle / medium / low cases at base noise ``eps_n``."""
    return [run_case(draws, name, eps_n, ratio * eps_n) for name, ratio in CASES]


def plot_histograms(results: Sequence[CaseResult], title: str, bins: int = 40) -> Figure:
    """Fig. 4 layout: max-norm errors (top row) and TV errors (bottom row), one column per case,
    NTP and RPT histograms overlaid with their means as dashed lines."""
    fig = Figure(figsize=(4.0 * len(results), 6.0))
    axes = fig.subplots(2, len(results), squeeze=False)
    rows = (("max", r"$\|\epsilon\|_\infty$"), ("tv", r"$\|\epsilon\|_{TV}$"))
    for col, result in enumerate(results):
        for row, (metric, label) in enumerate(rows):
            ax = axes[row][col]
            ntp, rpt = getattr(result, f"{metric}_ntp"), getattr(result, f"{metric}_rpt")
            edges = np.histogram_bin_edges(np.concatenate([ntp, rpt]), bins=bins)
            for values, color, who in ((ntp, "tab:red", "NTP"), (rpt, "tab:blue", "RPT")):
                ax.hist(values, bins=edges, alpha=0.5, color=color, label=f"{who} (mean {values.mean():.3g})")
                ax.axvline(values.mean(), color=color, linestyle="--")
            ax.set_title(f"{result.name}: eps_p = {result.eps_p:g}, eps_n = {result.eps_n:g}", fontsize=9)
            ax.set_xlabel(label)
            ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
