"""The scaling study's summary: each quantity per size with intervals, its fits against parameter
count, the crossover of the eps change after one iteration, and the registered predictions
(docs/scaling_preregistration.md).

Quantities per model (:mod:`rpt.studies.scaling.measure`; units: validation batches for the
losses, positions for the rest):

* ``ntp_loss``, ``ptp1_loss``: validation losses (nats/token) of the fine-tuned RPT model;
* ``ptp_excess``: PTP head loss minus the NTP-implied PTP's loss (nats);
* ``eps0``: the error analysis's ``eps_0 = 1 - p_0(x_i)`` (NTP, the same for every rule);
* per PTP rule ``r``: ``eps1_r``, ``eps_change_r = eps_1 - eps_0`` and ``share_improved_r``
  (the share of positions with ``p_1 > p_0``, Fig. 6).

Per size: the mean over seeds, Student's t interval over seeds, and the bootstrap interval over
seeds and units (:func:`rpt.statistics.seeds_and_units_means`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rpt.statistics import order_statistic_interval, seeds_and_units_means, t_interval
from rpt.studies.scaling import fits
from rpt.studies.scaling.measure import RULES

# The form fitted to each quantity against N (registered from the pilot).
POWER, LINEAR = "power law with offset", "log-linear"
PRIMARY_RULE = "sampled_0"  # the crossover the study registers a prediction for (eq. 4, confidence 0)
BOOTSTRAP_SEED = 45
# The paper's 8B model (Table 2, the github column: eps 0.18 -> 0.15 after one iteration; Fig. 6:
# 64.5% of DCLM tokens improved), greedy PTP with confidence 0.9: comparable in kind to greedy_0.9.
PAPER = {"parameters": 8.03e9, "rule": "greedy_0.9", "eps0": 0.18, "eps1_greedy_0.9": 0.15,
         "eps_change_greedy_0.9": -0.03, "share_improved_greedy_0.9": 0.645,
         "source": "RPT paper, Table 2 (github validation, k = 0 -> 1) and Fig. 6 (DCLM, not code)"}


def quantity_names() -> list[str]:
    return ["ntp_loss", "ptp1_loss", "ptp_excess", "eps0",
            *(f"{q}_{r}" for r in RULES for q in ("eps1", "eps_change", "share_improved"))]


def forms() -> dict[str, str]:
    return {name: POWER if name in ("ntp_loss", "ptp1_loss") else LINEAR for name in quantity_names()}


def measured(models: Sequence[dict]) -> dict[str, fits.Measured]:
    """One size's seeds (measured models) as :class:`~rpt.studies.scaling.fits.Measured` per quantity."""
    out = {}
    for name, k in (("ntp_loss", 0), ("ptp1_loss", 1)):
        out[name] = fits.Measured(np.array([np.asarray(m["losses"]["batch_sum"])[:, k] for m in models]),
                                  np.array([np.asarray(m["losses"]["batch_count"])[:, k] for m in models]))
    out["ptp_excess"] = fits.Measured.of_means(
        [np.subtract(m["ptp_excess"]["head"], m["ptp_excess"]["implied"]) for m in models])
    first = next(iter(RULES))
    out["eps0"] = fits.Measured.of_means([1.0 - np.asarray(m["error_analysis"][first]["p0"]) for m in models])
    for r in RULES:
        p0 = [np.asarray(m["error_analysis"][r]["p0"]) for m in models]
        p1 = [np.asarray(m["error_analysis"][r]["p1"]) for m in models]
        out[f"eps1_{r}"] = fits.Measured.of_means([1.0 - x for x in p1])
        out[f"eps_change_{r}"] = fits.Measured.of_means([a - b for a, b in zip(p0, p1)])
        out[f"share_improved_{r}"] = fits.Measured.of_means([(b > a).astype(np.float64) for a, b in zip(p0, p1)])
    return out


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def summarise_quantity(name: str, params: np.ndarray, per_size: Sequence[fits.Measured], resamples: int,
                       seed: int) -> dict:
    """Per size (mean, per seed, intervals), the fits on all sizes and on all but the largest."""
    log_n = np.log10(params)
    means = np.array([m.mean() for m in per_size])
    reps = seeds_and_units_means([(m.num, m.den) for m in per_size], resamples, seed)
    sizes = [{"parameters": int(n), "mean": float(mu), "per_seed": [float(x) for x in m.per_seed()],
              "ci95_seeds": t_interval(m.per_seed()), "ci95": order_statistic_interval(reps[:, j])}
             for j, (n, mu, m) in enumerate(zip(params, means, per_size))]
    linear = fits.crossover_summary(log_n, means, reps)
    out = {"form": forms()[name], "sizes": sizes, "log_linear": linear,
           # a line through the others needs at least two of them
           "leave_largest_out": fits.leave_largest_out(log_n, means, reps) if len(params) >= 3 else None}
    if forms()[name] == POWER:
        power = fits.power_offset(params, means)
        out["power_offset"] = power
        held_out = fits.power_offset(params[:-1], means[:-1]) if len(params) >= 4 else None
        if held_out is not None:
            pred = float(fits.power_offset_value(held_out, params[-1]))
            ci = sizes[-1]["ci95"]
            out["power_offset_leave_largest_out"] = {
                "fit": held_out, "predicted": pred, "observed": float(means[-1]), "observed_ci95": ci,
                "held": bool(ci[0] <= pred <= ci[1])}
    return out


def group(models: Sequence[dict]) -> tuple[np.ndarray, list[list[dict]]]:
    """Models grouped by size (increasing parameter count), seeds in the same order in every size."""
    by = {}
    for m in models:
        by.setdefault(m["parameters"], []).append(m)
    params = np.array(sorted(by), dtype=np.float64)
    groups = [sorted(by[int(n)], key=lambda m: m["seed"]) for n in params]
    return params, groups


def summarise(models: Sequence[dict], resamples: int,
              predicted_crossover: tuple[float | None, float | None] = (None, None)) -> dict:
    """Every quantity per size with its fits, the crossovers, and the registered predictions
    (``predicted_crossover``: the primary crossover's registered range in log10 N, None unbounded)."""
    params, groups = group(models)
    per_size = [measured(g) for g in groups]
    quantities = {name: summarise_quantity(name, params, [ps[name] for ps in per_size], resamples,
                                           BOOTSTRAP_SEED + i)
                  for i, name in enumerate(quantity_names())}
    return {"parameters": [int(n) for n in params], "quantities": quantities,
            "crossover": {r: quantities[f"eps_change_{r}"]["log_linear"] for r in RULES},
            "predictions": predictions(quantities, predicted_crossover), "paper_8b": PAPER}


def in_range(x: float | None, bounds: Sequence[float | None]) -> bool:
    """``x`` (None: no crossover, +inf) inside ``[low, high]`` (None: unbounded on that side)."""
    value = math.inf if x is None else x
    return (bounds[0] is None or value >= bounds[0]) and (bounds[1] is None or value <= bounds[1])


def predictions(q: dict, predicted_crossover: Sequence[float | None] = (None, None)) -> dict:
    """The registered checks (docs/scaling_preregistration.md), each held or failed."""
    excess = q["ptp_excess"]["log_linear"]
    primary = q[f"eps_change_{PRIMARY_RULE}"]["log_linear"]
    out = {"crossover_as_registered": {
        "what": f"the crossover of eps_1 - eps_0 ({PRIMARY_RULE}) lies in the registered range of log10 N "
                "(None: unbounded; no crossover counts as +infinity)",
        "registered_log10": list(predicted_crossover), "log10_crossover": primary["log10_crossover"],
        "log10_crossover_ci95": primary["log10_crossover_ci95"],
        "held": in_range(primary["log10_crossover"], predicted_crossover)},
        "excess_falls": {"what": "the PTP excess falls with size: the log-linear slope's 95% interval (seeds x "
                                    "positions) lies below 0", "slope": excess["b"], "slope_ci95": excess["b_ci95"],
                            "held": bool(excess["b_ci95"][1] < 0)}}
    for r in RULES:
        lo = q[f"eps_change_{r}"]["leave_largest_out"]
        if lo is None:
            continue
        out[f"largest_eps_change_{r}"] = {
            "what": f"eps_1 - eps_0 ({r}) at the largest size lies where the log-linear fit on the other sizes "
                    "predicts it (the 95% interval of observed minus predicted contains 0)", **lo}
    for name in ("ntp_loss", "ptp1_loss"):
        lo = q[name].get("power_offset_leave_largest_out")
        if lo is not None:
            out[f"largest_{name}"] = {"what": f"the power law with offset fitted to {name} on the other sizes "
                                              "predicts the largest size inside its 95% interval", **lo}
    return out
