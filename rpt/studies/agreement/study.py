"""Where RPT wins: trained models on the agreement-pairs source, scored exactly, and the
pre-registered predictions P1-P4 and the co-primary (docs/agreement_preregistration.md).

Each model's exact sampled law of the next two tokens at k = 0 (NTP) and k = 1 (one eq. 4 sweep,
sampled PTP, temperature 1) is compared in total variation with the truth on both window types
(:mod:`rpt.studies.agreement.source`), with the same machinery as the controlled study (model conditionals,
window chain, Sec. 3 error measures). The three-level noise model
(:class:`rpt.studies.controlled.theory_prediction.ThreeLevel`) turns each model's measured (eps_m, eps_c, eps_p)
into a predicted TV_1 / TV_0 and a crossover eps_p*.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rpt.statistics import bootstrap_ci, bootstrap_ci_seeds_and_contexts, t_interval
from rpt.studies.agreement import decomposition
from rpt.studies.agreement import source as ag
from rpt.studies.controlled import theory_prediction as tt
from rpt.studies.controlled import window_chain as wc
from rpt.studies.controlled.model_conditionals import model_conditionals
from rpt.studies.sec3.errors import mean_eps, sec3_errors
from rpt.studies.tv_summary import summarise_tv

# (name, q): q None is the pure-NTP arm (objective ntp). Every arm: w = 2, s = 1, configs/agreement.yaml.
ARMS: tuple[tuple[str, float | None], ...] = (("ntp", None), ("rpt_q0.3", 0.3), ("rpt_q0.1", 0.1))
PRIMARY, BASELINE = "rpt_q0.3", "ntp"
WINDOW_TYPES = ("tag_first", "content_first")
P2_SIZE = (-0.045, -0.015)  # the predicted size of the primary difference
P1_FRACTION = 0.8  # "at least 4 of 5 seeds"
P3_RATIO_TOLERANCE, P3_RATIO_FRACTION = 0.1, 0.8
BOOTSTRAP_RESAMPLES = 10000


@dataclass
class Truth:
    """One window type: the evaluation contexts, the true joint over the whole vocabulary and its
    conditionals, and the three-level model on the joint's support."""

    windows: ag.Windows
    cond: wc.WindowConditionals
    three_level: tt.ThreeLevel


def truth_for(design: ag.Design, params: ag.Params | None = None) -> dict[str, Truth]:
    params = params or ag.make_params(design)
    out = {}
    for name, w in ag.evaluation_windows(params, design).items():
        support = w.joint[:, w.first][:, :, w.second]
        out[name] = Truth(w, wc.truth_conditionals(w.joint), tt.ThreeLevel(support))
    return out


def evaluate_model(model, truth: dict[str, Truth], design: ag.Design, batch_size: int = 64) -> dict:
    """Per window type: ``tv[2, n]`` (k = 0, 1 per context) and the mean Sec. 3 errors."""
    out = {}
    for name, t in truth.items():
        cond = model_conditionals(model, t.windows.contexts, 2, design.vocab, batch_size=batch_size)
        j0, j1 = wc.joints_by_iters(cond, 1)
        errs = sec3_errors(cond, t.cond)
        out[name] = {"tv": np.stack([wc.tv(j0, t.windows.joint), wc.tv(j1, t.windows.joint)]),
                     "eps": mean_eps(errs),
                     "kl": {k: float(errs[f"kl_{k}"].mean()) for k in ("marginal", "next", "prev")}}
    return out


def model_entry(arm: str, seed: int, result: dict, truth: dict[str, Truth]) -> dict:
    """One trained model's row: per window type its TVs, errors, prediction and signs."""
    entry = {"arm": arm, "seed": seed, "windows": {}}
    for name, r in result.items():
        tv = r["tv"]
        tv0, tv1 = float(tv[0].mean()), float(tv[1].mean())
        pred = truth[name].three_level.predict(r["eps"]["m"], r["eps"]["c"], r["eps"]["p"])
        entry["windows"][name] = {
            "tv0": tv0, "tv1": tv1, "tv1_over_tv0": tv1 / tv0,
            "diff_ci95": bootstrap_ci(tv[1] - tv[0], resamples=BOOTSTRAP_RESAMPLES, seed=seed),
            "eps": r["eps"], "kl": r["kl"], "prediction": pred,
            "predicted_sign": tt.three_level_sign(r["eps"]["p"], pred["eps_p_star"], pred["above_range"]),
            "observed_sign": int(np.sign(tv1 - tv0))}
    return entry


# ---- the predictions ---------------------------------------------------------------------------------
def paired_difference(a: np.ndarray, b: np.ndarray, seed: int) -> dict:
    """``a - b`` for ``[S, n]`` arrays (seed s of one arm against seed s of the other, the same n
    contexts): the mean, the per-seed means, Student's t interval over the S seed pairs and the
    paired bootstrap over contexts (resampled jointly across seeds)."""
    diff = np.asarray(a) - np.asarray(b)
    per_seed = [float(x) for x in diff.mean(axis=1)]
    seeds_ci = t_interval(per_seed)
    ctx_ci = bootstrap_ci(diff, resamples=BOOTSTRAP_RESAMPLES, seed=seed)
    below = seeds_ci is not None and seeds_ci[1] < 0 and ctx_ci[1] < 0
    above = seeds_ci is not None and seeds_ci[0] > 0 and ctx_ci[0] > 0
    return {"mean": float(diff.mean()), "per_seed": per_seed, "ci95_seeds": seeds_ci, "ci95_contexts": ctx_ci,
            "both_below_0": bool(below), "both_above_0": bool(above)}


def pooled(tv: dict[str, np.ndarray]) -> np.ndarray:
    """Both window types of a document averaged: ``[S, K, n]`` (the documents are the unit)."""
    return 0.5 * (tv["tag_first"] + tv["content_first"])


def predictions(entries: Sequence[dict], tvs: dict[str, dict[str, np.ndarray]]) -> dict:
    """P1-P4 and the co-primary, as registered. ``tvs[arm][window]``: ``[S, 2, n]``, seeds in the same
    order for every arm (arms with the same seed index share the data order)."""
    rpt, ntp = tvs[PRIMARY], tvs[BASELINE]
    out = {}
    p2 = paired_difference(rpt["tag_first"][:, 1], ntp["tag_first"][:, 0], seed=2)
    p2.update(rpt_tv1=float(rpt["tag_first"][:, 1].mean()), ntp_tv0=float(ntp["tag_first"][:, 0].mean()),
              size_range=list(P2_SIZE), size_as_predicted=bool(P2_SIZE[0] <= p2["mean"] <= P2_SIZE[1]))
    p2["held"] = p2["both_below_0"]
    out["P2"] = p2
    co = paired_difference(pooled(rpt)[:, 1], pooled(ntp)[:, 0], seed=5)
    co.update(rpt_tv1=float(pooled(rpt)[:, 1].mean()), ntp_tv0=float(pooled(ntp)[:, 0].mean()))
    co["held"] = not co["both_below_0"]  # predicted: no significant gain pooled over window types
    out["co_primary"] = co
    own = [float(x) for x in (rpt["tag_first"][:, 1] - rpt["tag_first"][:, 0]).mean(axis=1)]
    need = math.ceil(P1_FRACTION * len(own) - 1e-9)
    out["P1"] = {"per_seed": own, "negative": sum(d < 0 for d in own), "needed": need,
                 "held": sum(d < 0 for d in own) >= need}
    cases = [(e["arm"], e["seed"], name, w) for e in entries for name, w in e["windows"].items()]
    decided = [c for c in cases if c[3]["predicted_sign"] != 0]
    misses = [(a, s, n) for a, s, n, w in decided if w["predicted_sign"] != w["observed_sign"]]
    close = [abs(w["prediction"]["tv1_over_tv0"] - w["tv1_over_tv0"]) <= P3_RATIO_TOLERANCE for *_, w in cases]
    out["P3"] = {"cases": len(cases), "decided": len(decided), "signs_agree": len(decided) - len(misses),
                 "sign_misses": misses, "undecided": [(a, s, n) for a, s, n, w in cases if w["predicted_sign"] == 0],
                 "ratio_within": int(sum(close)), "ratio_fraction": float(np.mean(close)) if close else 0.0,
                 "saturated": [(a, s, n, w["prediction"]["saturated"]) for a, s, n, w in cases
                               if w["prediction"]["saturated"]],
                 "held": not misses and bool(close) and float(np.mean(close)) >= P3_RATIO_FRACTION}
    ntp_entries = [e for e in entries if e["arm"] == BASELINE]
    premise = {name: [(e["seed"], e["windows"][name]["eps"]["m"], e["windows"][name]["eps"]["c"]) for e in ntp_entries]
               for name in WINDOW_TYPES}
    out["P4"] = {"eps_m_vs_eps_c": premise,
                 "held": all(m > c for _, m, c in premise["tag_first"]) and bool(premise["tag_first"])}
    return out


def arm_table(tvs: dict[str, dict[str, np.ndarray]]) -> list[dict]:
    """Per arm and window type (and pooled), TV_0 and TV_1 pooled over seeds, with intervals: ``ci95``
    resamples the contexts (jointly across the seeds, which stay fixed), ``ci95_seeds_and_contexts``
    resamples both (:func:`seeds_and_contexts_intervals`)."""
    rows = []
    for arm, by_window in tvs.items():
        for name, tv in [*by_window.items(), ("pooled", pooled(by_window))]:
            s = summarise_tv(tv, seed=3)
            rows.append({"arm": arm, "window": name, "tv0": s["k"]["0"], "tv1": s["k"]["1"], "diff": s["diff_1_0"]})
    add_seeds_and_contexts_intervals(rows, tvs)
    return rows


def add_seeds_and_contexts_intervals(rows: list[dict], tvs: dict[str, dict[str, np.ndarray]]) -> None:
    """Each arm-table row's TV_0, TV_1 and TV_1 - TV_0 get ``ci95_seeds_and_contexts``: the two-way
    bootstrap over training seeds and contexts of the ``[S, n]`` values (``tvs[arm][window]``: ``[S, 2, n]``)."""
    for row in rows:
        by_window = tvs[row["arm"]]
        tv = pooled(by_window) if row["window"] == "pooled" else np.asarray(by_window[row["window"]])
        for key, values in (("tv0", tv[:, 0]), ("tv1", tv[:, 1]), ("diff", tv[:, 1] - tv[:, 0])):
            row[key]["ci95_seeds_and_contexts"] = bootstrap_ci_seeds_and_contexts(
                values, resamples=BOOTSTRAP_RESAMPLES, seed=13)


def summarise(design: ag.Design, entries: list[dict], tvs: dict, source: dict) -> dict:
    seeds = [e["seed"] for e in entries if e["arm"] == BASELINE]  # the order of tvs' rows
    return {"study": "agreement", "metric": (
        "total variation between the true law of the next two tokens and the trained model's exact sampled law "
        "(k = 0: NTP; k = 1: one eq. 4 sweep with sampled PTP, temperature 1), mean over "
        f"{design.contexts} contexts per window type (tag-first: cut at {design.cuts['tag_first']} tokens; "
        f"content-first: {design.cuts['content_first']}); pooled = the two window types of a document averaged"),
        "lower_is_better": True, "predictions": predictions(entries, tvs), "arms": arm_table(tvs),
        "decomposition": decomposition.decompose(entries, seeds, tvs),
        "models": entries, "source": source, "design": design.to_dict()}


# ---- report ------------------------------------------------------------------------------------------
def _f(x) -> str:
    return "" if x is None else f"{x:.4f}"


def _ci(c) -> str:
    return "" if c is None else f"[{c[0]:+.4f}, {c[1]:+.4f}]"


def verdicts(summary: dict) -> list[list]:
    p = summary["predictions"]
    held = lambda x: "**held**" if x["held"] else "**failed**"  # noqa: E731
    p3 = p["P3"]
    return [
        ["P2 (primary): tag-first, RPT q=0.3 TV1 - NTP TV0 < 0", held(p["P2"]),
         f"{p['P2']['mean']:+.4f} (RPT TV1 {_f(p['P2']['rpt_tv1'])}, NTP TV0 {_f(p['P2']['ntp_tv0'])}); seeds "
         f"{_ci(p['P2']['ci95_seeds'])}, contexts {_ci(p['P2']['ci95_contexts'])}; size in [-0.045, -0.015]: "
         f"{'yes' if p['P2']['size_as_predicted'] else 'no'}"],
        ["co-primary: pooled, no significant gain", held(p["co_primary"]),
         f"{p['co_primary']['mean']:+.4f} (RPT TV1 {_f(p['co_primary']['rpt_tv1'])}, NTP TV0 "
         f"{_f(p['co_primary']['ntp_tv0'])}); seeds {_ci(p['co_primary']['ci95_seeds'])}, contexts "
         f"{_ci(p['co_primary']['ci95_contexts'])}"],
        ["P1: RPT q=0.3's own TV1 - TV0 < 0 on tag-first, >= 80% of seeds", held(p["P1"]),
         f"{p['P1']['negative']} of {len(p['P1']['per_seed'])} negative: "
         + ", ".join(f"{d:+.4f}" for d in p["P1"]["per_seed"])],
        ["P3: sign from eps_p vs eps_p*; predicted TV1/TV0 within 0.1 for >= 80%", held(p3),
         f"signs {p3['signs_agree']}/{p3['decided']} decided agree ({len(p3['undecided'])} undecided); "
         f"ratio within 0.1: {p3['ratio_within']}/{p3['cases']} ({p3['ratio_fraction']:.0%})"],
        ["P4: NTP arm eps_marginal > eps_conditional (tag-first), every seed", held(p["P4"]),
         "; ".join(f"s{s}: {m:.4f} vs {c:.4f}" for s, m, c in p["P4"]["eps_m_vs_eps_c"]["tag_first"])],
    ]


def markdown_tables(summary: dict) -> list[tuple[list[str], list[list]]]:
    models = [[e["arm"], e["seed"], name, _f(w["tv0"]), _f(w["tv1"]), _ci(w["diff_ci95"]), _f(w["tv1_over_tv0"]),
               _f(w["prediction"]["tv1_over_tv0"]), _f(w["eps"]["m"]), _f(w["eps"]["c"]), _f(w["eps"]["p"]),
               _f(w["prediction"]["eps_p_star"]) + (" (lower bound)" if w["prediction"]["above_range"] else ""),
               w["predicted_sign"], w["observed_sign"]]
              for e in summary["models"] for name, w in e["windows"].items()]
    arms = [[a["arm"], a["window"], _f(a["tv0"]["mean"]), _ci(a["tv0"]["ci95"]),
             _ci(a["tv0"].get("ci95_seeds_and_contexts")), _f(a["tv1"]["mean"]), _ci(a["tv1"]["ci95"]),
             _ci(a["tv1"].get("ci95_seeds_and_contexts")), f"{a['diff']['mean']:+.4f}", _ci(a["diff"]["ci95"]),
             _ci(a["diff"].get("ci95_seeds_and_contexts"))] for a in summary["arms"]]
    losses = [[e["arm"], e["seed"], _f((e.get("losses") or {}).get("eval_ntp_loss")),
               _f((e.get("losses") or {}).get("eval_ptp_loss_1"))] for e in summary["models"]]
    return [(["prediction", "outcome", "estimate and 95% intervals"], verdicts(summary)),
            (["arm", "window", "TV0", "95% CI contexts", "95% CI seeds+contexts", "TV1", "95% CI contexts",
              "95% CI seeds+contexts", "TV1-TV0", "95% CI contexts", "95% CI seeds+contexts"], arms),
            (["arm", "seed", "window", "TV0", "TV1", "TV1-TV0 95% CI (contexts)", "TV1/TV0", "predicted TV1/TV0",
              "eps_m", "eps_c", "eps_p", "eps_p*", "predicted sign", "observed sign"], models),
            (["arm", "seed", "val NTP loss", "val PTP-1 loss"], losses)]


def plot(summary: dict):
    """TV_1 against TV_0 per model and window type (filled: measured; open: the three-level model's
    prediction at the model's errors; the diagonal is the crossover TV_1 = TV_0), and TV_1 / TV_0
    against eps_p / eps_p* (the predicted crossover at 1)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(14, 4.4))
    axes = fig.subplots(1, 3)
    colors = {"ntp": "tab:gray", "rpt_q0.3": "tab:blue", "rpt_q0.1": "tab:green"}
    for ax, name in zip(axes[:2], WINDOW_TYPES):
        pts = []
        for e in summary["models"]:
            w = e["windows"][name]
            color = colors.get(e["arm"], "tab:purple")
            ax.plot([w["tv0"]], [w["tv1"]], "o", color=color, label=e["arm"] if e["seed"] == summary["models"][0]["seed"] else None)
            pr = w["prediction"]
            ax.plot([w["tv0"]], [w["tv0"] * pr["tv1_over_tv0"]], "o", mfc="none", color=color)
            ax.plot([w["tv0"]] * 2, [w["tv1"], w["tv0"] * pr["tv1_over_tv0"]], "-", color=color, alpha=0.3, linewidth=1)
            pts += [w["tv0"], w["tv1"], w["tv0"] * pr["tv1_over_tv0"]]
        hi = 1.05 * max(pts)
        ax.plot([0, hi], [0, hi], "--", color="black", linewidth=1, label="TV1 = TV0 (crossover)")
        ax.set_xlim(0, hi)
        ax.set_ylim(0, hi)
        ax.set_xlabel("TV0 (NTP sampling)")
        ax.set_ylabel("TV1 (one RPT iteration)")
        ax.set_title(f"{name.replace('_', '-')} windows (open: three-level prediction)", fontsize=9)
        ax.legend(fontsize=7)
    bx = axes[2]
    for e in summary["models"]:
        for name, marker in zip(WINDOW_TYPES, ("o", "s")):
            w = e["windows"][name]
            star = w["prediction"]["eps_p_star"]
            if star > 0:
                bx.plot([w["eps"]["p"] / star], [w["tv1_over_tv0"]], marker, color=colors.get(e["arm"], "tab:purple"),
                        mfc="none" if name == "content_first" else None)
    bx.axvline(1.0, color="tab:orange", linestyle=":", label="eps_p = eps_p*(eps_m, eps_c)")
    bx.axhline(1.0, color="black", linestyle="--", linewidth=1)
    bx.set_xscale("log")
    bx.set_xlabel("eps_p / eps_p* (filled: tag-first, open: content-first)")
    bx.set_ylabel("observed TV1 / TV0")
    bx.legend(fontsize=7)
    fig.tight_layout()
    return fig
