"""Sec. 3's error measures (w = 2) of a model's window conditionals against the true ones
(``eps_p`` / ``eps_n`` in total variation, KL, entropies, the mixing factor ``kappa``), and the
Sec. 3 noise model's prediction on a source in the same measures, so a trained model's point
sits on the prediction's axes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rpt.studies.controlled import window_chain as wc


def _tv_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return 0.5 * np.abs(a - b).sum(axis=-1)


def _kl_rows(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    safe_p = np.where(p > 0, p, 1.0)
    return np.where(p > 0, p * (np.log(safe_p) - np.log(np.maximum(q, 1e-300))), 0.0).sum(axis=-1)


def _entropy_rows(p: np.ndarray) -> np.ndarray:
    return -np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0).sum(axis=-1)


def sec3_errors(model: wc.WindowConditionals, truth: wc.WindowConditionals) -> dict[str, np.ndarray]:
    """Per-context errors of the three conditionals of eq. 4 (w = 2), in total variation (half L1).

    * ``eps_marginal``: ``TV(p^(x_i), p(x_i))`` -- the paper's ``||eps_i||_1`` (halved);
    * ``eps_next_max`` / ``eps_prev_max``: the max over conditioning tokens of the NTP
      ``p(x_{i+1}|x_i)`` / PTP ``p(x_i|x_{i+1})`` row errors -- the paper's ``||eps_{i+1|i}||_inf``
      and ``||eps_{i|i+1}||_inf`` (eq. 19, halved);
    * ``eps_next_avg`` / ``eps_prev_avg``: the same rows weighted by the true law of the
      conditioning token (the max is set by rare tokens the model has barely seen);
    * ``kl_*`` / ``entropy_*``: ``KL(truth || model)`` and the true entropy (the paper's eq. 21
      argument: cross-entropy = entropy + KL);
    * ``kappa = 1 / (1 - Lambda)``: Lambda the ergodicity coefficient of the true eq. 27 kernel,
      ``max_{b, b'} TV(p(.|b), p(.|b'))``; ``rho``: the RPT factor of eq. 18.
    """
    if model.window != 2:
        raise ValueError("the Sec. 3 error measures are defined for w = 2")
    pa, n_true, p_true = truth.init[0], truth.init[1], np.swapaxes(truth.resample[0], 1, 2)  # P rows by b
    pa_hat, n_hat, p_hat = model.init[0], model.init[1], np.swapaxes(model.resample[0], 1, 2)
    pb = np.einsum("ba,bac->bc", pa, n_true)
    next_tv, prev_tv = _tv_rows(n_hat, n_true), _tv_rows(p_hat, p_true)
    lam = _tv_rows(p_true[:, :, None, :], p_true[:, None, :, :]).max(axis=(1, 2))
    out = {
        "eps_marginal": _tv_rows(pa_hat, pa),
        "eps_next_max": next_tv.max(axis=1),
        "eps_prev_max": prev_tv.max(axis=1),
        "eps_next_avg": (pa * next_tv).sum(axis=1),
        "eps_prev_avg": (pb * prev_tv).sum(axis=1),
        "kl_marginal": _kl_rows(pa, pa_hat),
        "kl_next": (pa * _kl_rows(n_true, n_hat)).sum(axis=1),
        "kl_prev": (pb * _kl_rows(p_true, p_hat)).sum(axis=1),
        "entropy_marginal": _entropy_rows(pa),
        "entropy_next": (pa * _entropy_rows(n_true)).sum(axis=1),
        "entropy_prev": (pb * _entropy_rows(p_true)).sum(axis=1),
        "kappa": 1.0 / np.maximum(1.0 - lam, 1e-12),
    }
    out["rho"] = out["kappa"] * (out["eps_prev_max"] + out["eps_next_max"]) / np.maximum(
        out["eps_marginal"] + out["eps_next_max"], 1e-300)
    return out


def mean_eps(errors: dict[str, np.ndarray]) -> dict[str, float]:
    """The errors of eq. 4's three conditionals as means over contexts: ``m`` the NTP marginal, ``c``
    the NTP conditional and ``p`` the PTP conditional (rows weighted by the true law)."""
    return {"m": float(errors["eps_marginal"].mean()), "c": float(errors["eps_next_avg"].mean()),
            "p": float(errors["eps_prev_avg"].mean())}


def eps_ratios(errors: dict[str, np.ndarray]) -> dict[str, float]:
    """``eps_p / eps_n`` as ratios of means over contexts: like for like (row-averaged conditionals),
    the paper's max-norms, and PTP against the NTP marginal."""
    m = {k: float(np.mean(v)) for k, v in errors.items()}
    return {
        "prev_avg/next_avg": m["eps_prev_avg"] / m["eps_next_avg"],
        "prev_max/next_max": m["eps_prev_max"] / m["eps_next_max"],
        "prev_avg/marginal": m["eps_prev_avg"] / m["eps_marginal"],
        "kl_prev/kl_next": m["kl_prev"] / m["kl_next"],
    }


def theory_curve(truth: wc.WindowConditionals, joint: np.ndarray, eps_n: float, ratios: Sequence[float],
                 iters: int, seed: int, repeats: int = 3) -> list[dict]:
    """Sec. 3's noise model (eq. 33) on this source's true conditionals: for each ``eps_p / eps_n``,
    the mean TV of the window joint after ``k = 0..iters`` iterations, and the same error measures
    as for a trained model (so a model's measured point sits on the same axes)."""
    curve = []
    for r in ratios:
        tvs, errs = [], []
        for rep in range(repeats):
            noisy = wc.noisy_conditionals(truth, eps_n, r * eps_n, seed=seed + 1000 * rep + int(round(100 * r)))
            tvs.append([wc.tv(j, joint) for j in wc.joints_by_iters(noisy, iters)])
            errs.append(sec3_errors(noisy, truth))
        tv = np.mean(np.asarray(tvs), axis=0)  # [k, B]
        ratio = eps_ratios({k: np.concatenate([e[k] for e in errs]) for k in errs[0]})
        curve.append({"eps_p/eps_n (noise weights)": r, "measured_ratio": ratio["prev_avg/next_avg"],
                      "tv_by_iters": {str(k): float(tv[k].mean()) for k in range(len(tv))},
                      "tv1_over_tv0": float(tv[1].mean() / tv[0].mean()),
                      "frac_improved": float((tv[1] < tv[0]).mean())})
    return curve

