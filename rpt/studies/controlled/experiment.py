r"""The controlled experiment: RPT vs NTP sampling of a trained model, measured against a known truth.

The data source is a hidden Markov model (:mod:`rpt.studies.controlled.hmm`) over a small vocabulary, so the
true joint of the next ``w`` tokens after any context follows from the forward algorithm. A model
is trained on samples of it with ``train.py`` (NTP pretraining, then the RPT fine-tune); then, for
contexts drawn from the source, the *exact* law of the ``w`` tokens the model would sample --
NTP (``k = 0``) and after ``k`` RPT iterations (eq. 4 / 6, sampled PTP at temperature 1) -- is
computed by enumeration (:mod:`rpt.studies.controlled.window_chain`) from the model's own conditionals
and compared with the true joint in total variation. The design and its rationale are in
``docs/controlled_experiment.md``.

This module holds one trained model against the truth (:func:`evaluate_model`), the summary of
the experiment over training seeds and its plot. Its pieces live beside it: the source design and
its files for ``train.py`` (:mod:`rpt.studies.controlled.source`), the model queries
(:mod:`rpt.studies.controlled.model_conditionals`), the Sec. 3 error measures and noise-model prediction
(:mod:`rpt.studies.sec3.errors`), the summary by RPT iteration (:mod:`rpt.studies.tv_summary`) and the
bootstrap intervals (:mod:`rpt.statistics`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure

from rpt.statistics import bootstrap_ci
from rpt.studies.controlled import hmm as hmm_lib
from rpt.studies.controlled import window_chain as wc
from rpt.studies.controlled.model_conditionals import model_conditionals
from rpt.studies.controlled.source import Design
from rpt.studies.sec3.errors import eps_ratios, sec3_errors
from rpt.studies.sec3.synthetic import stationary
from rpt.studies.tv_summary import summarise_tv


# ---- one trained model against the truth ---------------------------------------------------------------
@dataclass
class Truth:
    """The evaluation contexts and, for each, the true window joint and its conditionals."""

    contexts: np.ndarray  # [B, L]
    joint: np.ndarray  # [B] + [V] * w
    cond: wc.WindowConditionals


def truth_for(hmm: hmm_lib.HMM, design: Design) -> Truth:
    contexts = hmm_lib.sample(hmm, design.contexts, design.context_len, seed=design.eval_seed)
    joint = hmm_lib.window_joint(hmm, hmm_lib.predictive_states(hmm, contexts), design.window)
    return Truth(contexts, joint, wc.truth_conditionals(joint))


def stationary_joint(cond: wc.WindowConditionals) -> np.ndarray:
    """``k -> infinity`` for w = 2 (Sec. 3's object): the stationary law of the eq. 27 kernel,
    ``r(a) N(b|a)`` with ``r`` stationary for the ``x_i`` chain ``N @ P``."""
    next_cond, prev_cond = cond.init[1], np.swapaxes(cond.resample[0], 1, 2)
    r = stationary(next_cond @ prev_cond)
    return r[:, :, None] * next_cond


def evaluate_model(model, truth: Truth, design: Design, batch_size: int = 64) -> dict:
    """TV to the truth after ``k = 0..iters`` (``tv[k, context]``), the stationary TV (w = 2),
    the TV of the ``x_i`` marginal by ``k`` and the Sec. 3 error measures, per context; and the
    model's conditionals themselves (``conditionals``)."""
    cond = model_conditionals(model, truth.contexts, design.window, design.vocab, batch_size=batch_size)
    joints = wc.joints_by_iters(cond, design.iters)
    out = {"tv": np.stack([wc.tv(j, truth.joint) for j in joints]), "conditionals": cond}
    axes = tuple(range(2, 1 + design.window))
    out["marginal_tv"] = np.stack([wc.tv(j.sum(axis=axes), truth.joint.sum(axis=axes)) for j in joints])
    if design.window == 2:
        out["tv_stationary"] = wc.tv(stationary_joint(cond), truth.joint)
        out["errors"] = sec3_errors(cond, truth.cond)
    return out


# ---- the experiment's summary ------------------------------------------------------------------------

def source_stats(truth: Truth) -> dict:
    """What Sec. 3 asks of the source, from the truth alone (w = 2): how much the next token tells
    about the current one (entropy with and without it) and how fast the eq. 27 chain mixes."""
    if truth.cond.window != 2:
        return {}
    errs = sec3_errors(truth.cond, truth.cond)  # zero errors; the entropies and kappa are the truth's
    h_ntp, h_ptp = float(errs["entropy_marginal"].mean()), float(errs["entropy_prev"].mean())
    return {"entropy_ntp": h_ntp, "entropy_ptp": h_ptp, "information_next_about_current": h_ntp - h_ptp,
            "kappa_mean": float(errs["kappa"].mean()), "kappa_median": float(np.median(errs["kappa"]))}


def _mean_ci(values: np.ndarray, seed: int) -> dict:
    return {"mean": float(np.mean(values)), "ci95": bootstrap_ci(values, seed=seed)}


def summarise(design: Design, runs: Sequence[dict], theory: dict, stats: dict) -> dict:
    """The JSON of the experiment. ``runs``: per training seed, :func:`evaluate_model`'s arrays
    plus ``seed``, ``checkpoint`` and ``losses``."""
    tv = np.stack([r["tv"] for r in runs])  # [S, K, n]
    out = {
        "experiment": "controlled",
        "metric": (f"total variation distance between the law of the next {design.window} tokens sampled by the "
                   f"trained model (k RPT iterations, eq. 4, sampled PTP and NTP at temperature 1) and the true "
                   f"joint from the source, exact by enumeration, mean over {tv.shape[2]} contexts drawn from "
                   f"the source x {len(runs)} training seeds"),
        "lower_is_better": True,
        "window": design.window, "iters": design.iters, "contexts": int(tv.shape[2]),
        "context_len": design.context_len, "seeds": [r["seed"] for r in runs],
        **summarise_tv(tv),
    }
    out["goal"] = "k = 1 closer to the truth than k = 0 with the 95% interval of (k = 1) - (k = 0) below zero"
    out["goal_reached"] = bool(out["diff_ci95"][1] < 0.0)
    out["marginal_tv_by_iters"] = {str(k): float(np.stack([r["marginal_tv"][k] for r in runs]).mean())
                                   for k in range(tv.shape[1])}
    per_seed = []
    for i, r in enumerate(runs):
        entry = {"seed": r["seed"], "checkpoint": r["checkpoint"], "losses": r.get("losses"),
                 **summarise_tv(r["tv"][None], seed=17 + i)}
        if "errors" in r:
            entry["eps"] = {k: float(np.mean(v)) for k, v in r["errors"].items()}
            entry["eps_ratios"] = eps_ratios(r["errors"])
            entry["stationary"] = _mean_ci(r["tv_stationary"], seed=31 + i)
        per_seed.append(entry)
    out["per_seed"] = per_seed
    if all("errors" in r for r in runs):
        errors = {k: np.concatenate([r["errors"][k] for r in runs]) for k in runs[0]["errors"]}
        out["eps"] = {k: float(np.mean(v)) for k, v in errors.items()}
        out["eps_ratios"] = eps_ratios(errors)
        stat = np.stack([r["tv_stationary"] for r in runs])
        out["stationary"] = {**_mean_ci(stat, seed=41), "diff_vs_k0": _mean_ci(stat - tv[:, 0], seed=43)}
    out["theory"] = theory
    out["source"] = stats
    out["design"] = design.to_dict()
    return out


# ---- plot --------------------------------------------------------------------------------------------
def plot(summary: dict, others: Sequence[tuple[str, dict]] = ()) -> Figure:
    """Left: mean TV to the truth by RPT iteration (95% intervals), pooled and per seed. Right: the
    Sec. 3 noise-model prediction for this source (TV_1 / TV_0 against the measured eps_p / eps_n)
    with the trained models' measured points, and those of ``others`` (label, summary) runs."""
    fig = Figure(figsize=(11, 4))
    ax, bx = fig.subplots(1, 2)
    ks = sorted(summary["k"], key=int)
    x = np.array([int(k) for k in ks], dtype=float)
    for i, run in enumerate(summary["per_seed"]):
        means = [run["k"][k]["mean"] for k in ks]
        ax.plot(x + 0.05 * (i + 1), means, "o:", color="tab:gray", alpha=0.7, label="per seed" if i == 0 else None)
    means = np.array([summary["k"][k]["mean"] for k in ks])
    ci = np.array([summary["k"][k]["ci95"] for k in ks])
    ax.errorbar(x, means, yerr=[means - ci[:, 0], ci[:, 1] - means], fmt="o-", color="tab:blue", capsize=4,
                label=f"pooled, 95% CI ({summary['contexts']} contexts x {len(summary['per_seed'])} seeds)")
    ax.set_xticks(x)
    ax.set_xlabel("RPT iterations k (0 = NTP sampling)")
    ax.set_ylabel(f"TV(sampled joint of next {summary['window']}, truth)")
    d = summary["diff_1_0"]
    ax.set_title(f"k=1 - k=0: {d['mean']:+.4f}, 95% CI [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]", fontsize=9)
    ax.legend(fontsize=7)
    theory = summary["theory"]["curve"]
    bx.plot([t["measured_ratio"] for t in theory], [t["tv1_over_tv0"] for t in theory], "s-", color="tab:orange",
            label=f"Sec. 3 noise model on this source (eps_n = {summary['theory']['eps_n']})")
    colors = ("tab:blue", "tab:green", "tab:red", "tab:purple")
    for (label, s), color in zip([("this run", summary), *others], colors):
        for i, run in enumerate(s["per_seed"]):
            r = run["eps_ratios"]["prev_avg/next_avg"]
            bx.plot([r], [run["k"]["1"]["mean"] / run["k"]["0"]["mean"]], "o", color=color,
                    label=f"{label} (per seed)" if i == 0 else None)
    bx.axhline(1.0, color="black", linestyle="--", linewidth=1)
    bx.set_xlabel("eps_p / eps_n (true-law-weighted row TV errors of PTP and NTP)")
    bx.set_ylabel("TV_1 / TV_0 (below 1: RPT closer to the truth)")
    bx.legend(fontsize=7)
    fig.tight_layout()
    return fig
