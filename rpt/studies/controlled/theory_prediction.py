r"""Sec. 3's theory as a prediction (docs/theory_test_preregistration.md): crossovers from the truth alone, signs, the sweep's summary.

The controlled source (:mod:`rpt.studies.controlled.experiment`) fixes the true conditionals of every
context. Each *model of the error* says below which ``r = eps_p / eps_n`` (the PTP row error over
the NTP row error, both true-law-weighted TV, ``prev_avg/next_avg``) one RPT iteration brings the
sampled window closer to the truth (``TV_1 < TV_0``): that ``r*`` is the *crossover*.

* ``noise_model``: eq. 33, an independent U(0, 1) noise vector per conditional row;
* ``shared_noise``: eq. 33 with one noise vector per table and context, shared by all its rows
  (errors that do not average out over the conditioning token, as a trained head's need not);
* ``theorem1``: the RPT factor (eq. 18) below 1 with ``||eps_i||_1 = ||eps_{i+1|i}||_inf`` (the
  paper's eq. 20 approximation): ``kappa (r + 1) < 2``, i.e. ``r* = 2 / kappa - 1`` -- a bound, in
  max-norm units, reported beside the other two.

The first two are measured on curves ``(measured r, TV_1 / TV_0)`` and read off where the curve
crosses 1 (linear interpolation). :func:`shrunk_curve` is a trained model's own curve: its PTP
table shrunk toward the truth, ``P_t = P + t (P^ - P)``, its NTP tables kept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from scipy.stats import spearmanr

from rpt.statistics import bootstrap_ci
from rpt.studies.controlled import experiment as ctl
from rpt.studies.controlled import window_chain as wc
from rpt.studies.controlled.source import Design
from rpt.studies.error_analysis.analysis import ETAS  # the same etas as the LM error analysis reports
from rpt.studies.sec3.errors import eps_ratios, mean_eps, sec3_errors
from rpt.studies.tv_summary import summarise_tv

NOISE_WEIGHTS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5)
SHRINK = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5)


def shared_noisy_conditionals(cond: wc.WindowConditionals, eps_n: float, eps_p: float,
                              seed: int) -> wc.WindowConditionals:
    """:func:`window_chain.noisy_conditionals` (w = 2) with ONE noise vector per table and context,
    the same for every conditioning token, instead of a fresh one per row."""
    if cond.window != 2:
        raise ValueError("the shared-noise model is written for w = 2")
    rng = np.random.default_rng(seed)
    b, v = cond.init[0].shape

    def vector() -> np.ndarray:
        n = rng.uniform(0.0, 1.0, size=(b, v))
        return n / n.sum(axis=1, keepdims=True)

    p0 = (1 - eps_n) * cond.init[0] + eps_n * vector()
    nxt = (1 - eps_n) * cond.init[1] + eps_n * vector()[:, None, :]  # [B, a, b]: same law of b for every a
    prv = (1 - eps_p) * cond.resample[0] + eps_p * vector()[:, :, None]  # [B, a', b]: same law of a' for every b
    return wc.WindowConditionals([p0, nxt], [prv, nxt])


def _point(noisy: wc.WindowConditionals, truth: wc.WindowConditionals, joint: np.ndarray) -> tuple[float, float]:
    j0, j1 = wc.joints_by_iters(noisy, 1)
    errs = sec3_errors(noisy, truth)
    ratio = float(errs["eps_prev_avg"].mean() / errs["eps_next_avg"].mean())
    return ratio, float(wc.tv(j1, joint).mean() / wc.tv(j0, joint).mean())


def noise_curve(truth: wc.WindowConditionals, joint: np.ndarray, eps_n: float, shared: bool, seed: int,
                weights: Sequence[float] = NOISE_WEIGHTS) -> list[dict]:
    """``(noise weight eps_p/eps_n, measured r, TV_1/TV_0)`` for the (shared-)noise model."""
    make = shared_noisy_conditionals if shared else wc.noisy_conditionals
    out = []
    for i, r in enumerate(weights):
        ratio, tv_ratio = _point(make(truth, eps_n, r * eps_n, seed=seed + i), truth, joint)
        out.append({"weight": float(r), "ratio": ratio, "tv1_over_tv0": tv_ratio})
    return out


def shrunk_curve(model: wc.WindowConditionals, truth: wc.WindowConditionals, joint: np.ndarray,
                 ts: Sequence[float] = SHRINK) -> list[dict]:
    """A trained model's own curve: its PTP table moved toward the truth, ``P + t (P^ - P)``
    (``t = 1``: the model itself), its NTP tables as learned."""
    out = []
    for t in ts:
        prv = truth.resample[0] + t * (model.resample[0] - truth.resample[0])
        # t > 1 can push an entry below 0: clip and renormalise over the resampled token (axis 1).
        prv = np.clip(prv, 0.0, None)
        prv = prv / prv.sum(axis=1, keepdims=True)
        ratio, tv_ratio = _point(wc.WindowConditionals(model.init, [prv, model.resample[1]]), truth, joint)
        out.append({"t": float(t), "ratio": ratio, "tv1_over_tv0": tv_ratio})
    return out


def crossover(curve: Sequence[dict]) -> float | None:
    """The ratio where ``tv1_over_tv0`` first crosses 1 (linear interpolation between the two
    points that bracket it, the curve sorted by ratio); None if it never does."""
    pts = sorted((c["ratio"], c["tv1_over_tv0"]) for c in curve)
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if (y0 - 1.0) * (y1 - 1.0) <= 0 and y0 != y1:
            return float(x0 + (1.0 - y0) * (x1 - x0) / (y1 - y0))
    return None


def theorem1_crossover(kappa: np.ndarray) -> float:
    """``rho < 1`` with ``||eps_i||_1 = ||eps_{i+1|i}||_inf``: ``r < 2 / kappa - 1``, at the mean kappa."""
    return float(2.0 / np.mean(kappa) - 1.0)


def crossovers(truth: ctl.Truth, eps_n: float, seed: int) -> dict:
    """The three ``r*`` of the module docstring, from the truth alone, with the curves they come from."""
    curves = {"noise_model": noise_curve(truth.cond, truth.joint, eps_n, shared=False, seed=seed),
              "shared_noise": noise_curve(truth.cond, truth.joint, eps_n, shared=True, seed=seed)}
    kappa = sec3_errors(truth.cond, truth.cond)["kappa"]
    return {"noise_model": crossover(curves["noise_model"]), "shared_noise": crossover(curves["shared_noise"]),
            "theorem1": theorem1_crossover(kappa), "eps_n": eps_n, "curves": curves,
            "kappa_mean": float(np.mean(kappa))}


# ---- signs and the summary ---------------------------------------------------------------------------
def predicted_sign(ratio: float, r_star: float) -> int:
    """The pre-registered prediction: RPT helps (TV_1 - TV_0 < 0, sign -1) iff ``ratio < r*``."""
    return -1 if ratio < r_star else 1


def observed_sign(ci95: Sequence[float]) -> int:
    """The sign of TV_1 - TV_0 its 95% interval supports: 0 when the interval covers 0."""
    lo, hi = ci95
    return 0 if lo <= 0.0 <= hi else (1 if lo > 0 else -1)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    return float(spearmanr(x, y).statistic)


def arm_entry(q: float | None, seed: int, result: dict, r_star: float, truth: ctl.Truth,
              model_cond: wc.WindowConditionals | None = None) -> dict:
    """One trained model's row: ``result`` is :func:`controlled.evaluate_model`'s (``tv[K, n]``, errors)."""
    tv = result["tv"]
    ratio = eps_ratios(result["errors"])["prev_avg/next_avg"]
    s = summarise_tv(tv[None], seed=seed)
    entry = {"q": q, "seed": seed, "ratio": ratio, "tv": {"0": s["tv_by_iters"]["0"], "1": s["tv_by_iters"]["1"]},
             "tv_ci95": {"0": s["k"]["0"]["ci95"], "1": s["k"]["1"]["ci95"]},
             "diff_ci95": s["diff_ci95"], "tv1_over_tv0": s["tv_by_iters"]["1"] / s["tv_by_iters"]["0"],
             "predicted_sign": predicted_sign(ratio, r_star), "observed_sign": observed_sign(s["diff_ci95"])}
    if model_cond is not None:
        entry.update(scores_entry(model_cond, truth))
        entry["shrunk_curve"] = shrunk_curve(model_cond, truth.cond, truth.joint)
        entry["shrunk_crossover"] = crossover(entry["shrunk_curve"])
    return entry


def pooled_by_q(arms: Sequence[dict], tvs: dict) -> list[dict]:
    """Per arm (q), the seeds pooled: TV_0, TV_1 and TV_1 - TV_0 with intervals over contexts *and*
    seeds (:func:`rpt.statistics.bootstrap_ci` on ``[S, n]``), and the seed-to-seed spread."""
    out = []
    for q in dict.fromkeys(a["q"] for a in arms):
        tv = np.stack(tvs[q])  # [S, K, n]
        s = summarise_tv(tv, seed=7)
        rows = [a for a in arms if a["q"] == q]
        diffs = [a["tv"]["1"] - a["tv"]["0"] for a in rows]
        out.append({"q": q, "seeds": [a["seed"] for a in rows], "ratio_mean": float(np.mean([a["ratio"] for a in rows])),
                    "tv": {k: s["k"][k] for k in ("0", "1")}, "diff": s["diff_1_0"],
                    "diff_per_seed": diffs, "diff_seed_range": [float(min(diffs)), float(max(diffs))],
                    "observed_sign": observed_sign(s["diff_ci95"])})
    return out


def summarise(cross: dict, arms: list[dict], tvs: dict, ntp_q=None) -> dict:
    """``report.json["theory_test"]`` / ``docs/theory_test.json``. ``ntp_q``: the key of the pure-NTP
    arm (None: q is None); the practical test compares the best RPT arm's TV_1 with its TV_0."""
    rpt_arms = [a for a in arms if a["q"] != ntp_q]
    ntp = [a for a in arms if a["q"] == ntp_q]
    agree = [a["predicted_sign"] == a["observed_sign"] for a in rpt_arms]
    out = {"crossover": {k: cross[k] for k in ("noise_model", "shared_noise", "theorem1")},
           "arms": arms, "pooled": pooled_by_q(arms, tvs),
           "spearman": spearman([a["ratio"] for a in rpt_arms], [a["tv1_over_tv0"] for a in rpt_arms])
           if len(rpt_arms) > 2 else None,
           "predictions_confirmed": int(sum(agree)), "predictions_total": len(agree)}
    if ntp:
        out["ntp_arm_tv0"] = float(np.mean([a["tv"]["0"] for a in ntp]))
        if rpt_arms:
            out["practical"] = practical(tvs, ntp_q)
    out["confirms"] = _verdict(rpt_arms, cross, out["spearman"])
    return out


def practical(tvs: dict, ntp_q=None) -> dict:
    """The best RPT-trained arm's TV_1 (pooled over seeds) against the pure-NTP arm's TV_0, the
    difference's 95% interval over contexts and seeds (seeds paired by index, contexts jointly)."""
    ntp0 = np.stack(tvs[ntp_q])[:, 0]  # [S, n]
    tv1 = {q: np.stack(v)[:, 1] for q, v in tvs.items() if q != ntp_q}
    best = min(tv1, key=lambda q: tv1[q].mean())
    s = min(len(ntp0), len(tv1[best]))
    diff = tv1[best][:s] - ntp0[:s]
    ci = bootstrap_ci(diff, seed=11)
    return {"best_q": best, "best_rpt_tv1": float(tv1[best].mean()), "ntp_arm_tv0": float(ntp0.mean()),
            "diff": float(diff.mean()), "diff_ci95": ci, "rpt_beats_ntp_arm": bool(ci[1] < 0)}


def _verdict(rpt_arms: Sequence[dict], cross: dict, rho: float | None) -> dict:
    """The pre-registered reading (docs/theory_test_preregistration.md)."""
    lo, hi = cross["shared_noise"], cross["noise_model"]
    decided = [a for a in rpt_arms if a["observed_sign"] != 0]
    refuting = [a for a in decided if (a["ratio"] < lo and a["observed_sign"] > 0) or (a["ratio"] > hi and a["observed_sign"] < 0)]
    between = [a for a in decided if lo <= a["ratio"] < hi]
    return {"signs_agree": sum(a["predicted_sign"] == a["observed_sign"] for a in decided), "signs_decided": len(decided),
            "refuting_models": [(a["q"], a["seed"]) for a in refuting],
            "between_crossovers": [(a["q"], a["seed"], a["observed_sign"]) for a in between],
            "spearman_positive": None if rho is None else bool(rho > 0),
            "confirmed": bool(decided) and all(a["predicted_sign"] == a["observed_sign"] for a in decided)
            and (rho is None or rho > 0),
            "refuted": bool(refuting) or (rho is not None and rho <= 0)}


# ---- the sweep's evaluation and plot -------------------------------------------------------------------
def evaluate_arms(design: Design, truth: ctl.Truth, runs: Sequence[tuple], cross: dict,
                  load=None) -> dict:
    """``runs``: ``(q, seed, checkpoint)`` per trained model (q None: the pure-NTP arm). Each model's
    exact TV_0 / TV_1 and r against the truth, its shrunk-error curve, then :func:`summarise`."""
    if load is None:
        from rpt.sampling.loading import load_model, rpt_window_of  # late: transformers, for checkpoints

        def load(path):  # the sampler's one checkpoint loader; the sweep trains in float32 (configs/controlled_*.yaml)
            return load_model(path, rpt_window_of(path), "cpu", torch.float32)

    arms, tvs = [], {}
    for q, seed, checkpoint in runs:
        result = ctl.evaluate_model(load(checkpoint), truth, design)
        entry = arm_entry(q, seed, result, cross["noise_model"], truth, result["conditionals"])
        entry["checkpoint"] = str(checkpoint)
        arms.append(entry)
        tvs.setdefault(q, []).append(result["tv"][:2])
    out = summarise(cross, arms, tvs)
    out["curves"] = cross["curves"]
    out["kappa_mean"] = cross["kappa_mean"]
    return out


def plot(summary: dict):
    """TV_1/TV_0 against r: the two noise curves (truth alone), each model's own shrunk-error curve
    (thin), the trained models (points), the crossovers (vertical lines)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for name, color in (("noise_model", "tab:orange"), ("shared_noise", "tab:red")):
        c = sorted((p["ratio"], p["tv1_over_tv0"]) for p in summary["curves"][name])
        ax.plot(*zip(*c), "s-", color=color, label=f"{name.replace('_', ' ')} (truth alone), r* = "
                f"{summary['crossover'][name]:.2f}")
        ax.axvline(summary["crossover"][name], color=color, linestyle=":", linewidth=1)
    ax.axvline(summary["crossover"]["theorem1"], color="gray", linestyle=":", linewidth=1,
               label=f"Theorem 1 (max-norm units) r* = {summary['crossover']['theorem1']:.2f}")
    rpt_arms = [a for a in summary["arms"] if a["q"] is not None]
    for i, a in enumerate(rpt_arms):
        if "shrunk_curve" in a:
            c = sorted((p["ratio"], p["tv1_over_tv0"]) for p in a["shrunk_curve"])
            ax.plot(*zip(*c), "-", color="tab:blue", alpha=0.3, linewidth=1,
                    label="each model's shrunk-PTP curve" if i == 0 else None)
    for a in rpt_arms:
        ax.plot([a["ratio"]], [a["tv1_over_tv0"]], "o", color="tab:blue")
        ax.annotate(f"q={a['q']},s{a['seed']}", (a["ratio"], a["tv1_over_tv0"]), fontsize=6,
                    xytext=(3, 3), textcoords="offset points")
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
    rs = [a["ratio"] for a in rpt_arms]
    if rs:
        ax.set_xlim(0, max(3.0, 1.1 * max(rs)))
    ax.set_xlabel("r = eps_p / eps_n (true-law-weighted row TV, PTP over NTP)")
    ax.set_ylabel("TV_1 / TV_0 (below 1: one RPT iteration closer to the truth)")
    rho = summary.get("spearman")
    ax.set_title("trained models (points)" + (f", Spearman {rho:+.2f}" if rho is not None else ""), fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def markdown_tables(summary: dict) -> list[tuple[list[str], list[list]]]:
    f = lambda x: "" if x is None else f"{x:.4f}"  # noqa: E731
    ci = lambda c: f"[{c[0]:+.4f}, {c[1]:+.4f}]"  # noqa: E731
    rows = [["NTP arm" if a["q"] is None else a["q"], a["seed"], f(a["ratio"]), f(a["tv"]["0"]), f(a["tv"]["1"]),
             ci(a["diff_ci95"]), f(a["tv1_over_tv0"]), f(a.get("shrunk_crossover")), a["predicted_sign"],
             a["observed_sign"]] for a in summary["arms"]]
    pooled = [["NTP arm" if p["q"] is None else p["q"], f(p["ratio_mean"]), f(p["tv"]["0"]["mean"]),
               f(p["tv"]["1"]["mean"]), f(p["diff"]["mean"]), ci(p["diff"]["ci95"]),
               ", ".join(f"{d:+.4f}" for d in p["diff_per_seed"]), p["observed_sign"]] for p in summary["pooled"]]
    return [(["q", "seed", "r", "TV0", "TV1", "TV1-TV0 95% CI (contexts)", "TV1/TV0", "own shrunk-curve r*",
              "predicted sign", "observed sign"], rows),
            (["q", "mean r", "TV0", "TV1", "TV1-TV0", "95% CI (contexts x seeds)", "per seed", "observed sign"], pooled),
            (["crossover", "r*"], [[k, f(v)] for k, v in summary["crossover"].items()])] + _score_table(summary) + _loss_table(summary)


def _score_table(summary: dict) -> list:
    """Exact expected scores of p_k (k = 0, 1) at the true x_i, acceptance per eta, the precondition."""
    arms = [a for a in summary["arms"] if "scores" in a]
    if not arms:
        return []
    f = lambda x: f"{x:.4f}"  # noqa: E731
    rows = []
    for a in arms:
        sc, pc = a["scores"], a["precondition"]
        rows.append(["NTP arm" if a["q"] is None else a["q"], a["seed"],
                     *(f"{f(sc['0'][m])} -> {f(sc['1'][m])}" for m in ("table2", "log", "brier")),
                     f"{f(sc['ntp_argmax_onehot']['table2'])} / {f(sc['truth']['table2'])}",
                     " / ".join(f"{a['acceptance'][e]['greedy']:.3f}" for e in a["acceptance"]),
                     f"{f(pc['ptp_head'])} vs {f(pc['ntp_implied'])} (truth {f(pc['truth'])})"])
    return [(["q", "seed", "Table 2's 1-p, k 0 -> 1", "log score, k 0 -> 1", "Brier, k 0 -> 1",
              "1-p of argmax one-hot / of the truth", "greedy acceptance, eta 0/0.5/0.7/0.9",
              "PTP loss: head vs NTP-implied P*"], rows)]


def _loss_table(summary: dict) -> list:
    """Validation losses per model (train.py's last evaluation), when the sweep recorded them."""
    arms = [a for a in summary["arms"] if a.get("losses")]
    if not arms:
        return []
    f = lambda x: "" if x is None else f"{x:.4f}"  # noqa: E731
    return [(["q", "seed", "val NTP loss", "val PTP-1 loss", "PTP-1 - NTP"],
             [["NTP arm" if a["q"] is None else a["q"], a["seed"], f(a["losses"].get("eval_ntp_loss")),
               f(a["losses"].get("eval_ptp_loss_1")),
               f(a["losses"]["eval_ptp_loss_1"] - a["losses"]["eval_ntp_loss"]) if a["losses"].get("eval_ptp_loss_1") else ""]
              for a in arms])]


# ---- proper scores and the precondition on the controlled source (exact: the truth is known) ----------


def marginal_scores(pred: np.ndarray, truth: np.ndarray) -> dict:
    """Expected scores of predicted laws ``pred[B, V]`` of ``x_i`` when ``x_i ~ truth[B, V]``, mean
    over contexts: Table 2's ``1 - p(x)`` (improper: the argmax one-hot minimises it), the log score
    ``-log p(x)`` and the Brier score ``sum_a (p(a) - [a = x])^2`` (both proper: the truth minimises them)."""
    table2 = 1.0 - (truth * pred).sum(axis=-1)
    log = -(truth * np.log(np.maximum(pred, 1e-300))).sum(axis=-1)
    brier = (pred ** 2).sum(axis=-1) - 2.0 * (truth * pred).sum(axis=-1) + 1.0
    return {"table2": float(table2.mean()), "log": float(log.mean()), "brier": float(brier.mean())}


def acceptance_by_eta(cond: wc.WindowConditionals, etas: Sequence[float] = ETAS) -> dict:
    """The chance the first PTP step moves ``x_i`` (its proposal's PTP probability above eta), from
    the NTP window: greedy (argmax proposal) and sampled proposals."""
    m0 = wc.ntp_joint(cond).sum(axis=1)  # [B, b]: law of x_{i+1}
    prev = np.swapaxes(cond.resample[0], 1, 2)  # [B, b, a]
    top = prev.max(axis=-1)
    return {str(eta): {"greedy": float((m0 * (top > eta)).sum(axis=1).mean()),
                       "sampled": float((m0 * (prev * (prev > eta)).sum(axis=-1)).sum(axis=1).mean())}
            for eta in etas}


def implied_ptp(cond: wc.WindowConditionals) -> np.ndarray:
    """The PTP conditional the NTP head implies, ``P*(a|b) ∝ p^(a) N^(b|a)``, as ``[B, a, b]``."""
    joint = wc.ntp_joint(cond)
    return joint / np.maximum(joint.sum(axis=1, keepdims=True), 1e-300)


def precondition(cond: wc.WindowConditionals, joint: np.ndarray) -> dict:
    """Is the trained PTP head better than the PTP the NTP head implies? Expected PTP loss
    ``E[-log P(x_i | x_{i+1})]`` under the true joint, for the head and for P*, and the truth's own."""
    def loss(p):
        return float(-(joint * np.log(np.maximum(p, 1e-300))).sum(axis=(1, 2)).mean())

    true_prev = joint / np.maximum(joint.sum(axis=1, keepdims=True), 1e-300)
    out = {"ptp_head": loss(cond.resample[0]), "ntp_implied": loss(implied_ptp(cond)), "truth": loss(true_prev)}
    out["head_beats_implied"] = bool(out["ptp_head"] < out["ntp_implied"])
    return out


def scores_entry(cond: wc.WindowConditionals, truth: ctl.Truth, iters: int = 1) -> dict:
    """Per model: the scores of ``p_k`` (k = 0..iters, sampled PTP) and of the true marginal and the
    argmax one-hot (the improper metric's tell), acceptance per eta, the precondition."""
    true_marg = truth.joint.sum(axis=2)
    joints = wc.joints_by_iters(cond, iters)
    onehot = np.eye(true_marg.shape[1])[joints[0].sum(axis=2).argmax(axis=1)]
    return {"scores": {**{str(k): marginal_scores(j.sum(axis=2), true_marg) for k, j in enumerate(joints)},
                       "truth": marginal_scores(true_marg, true_marg), "ntp_argmax_onehot": marginal_scores(onehot, true_marg)},
            "acceptance": acceptance_by_eta(cond), "precondition": precondition(cond, truth.joint)}


# ---- the three-level noise model ----------------------------------------------------------------------
# Eq. 33's construction applied to each of the three conditionals eq. 4 uses, each at its own level:
#
#     p^(a)   = (1 - e_m) p(a)   + e_m n(a)        the first token's marginal (NTP)
#     N^(b|a) = (1 - e_c) N(b|a) + e_c n_a(b)      the NTP conditional of the second token
#     P^(a|b) = (1 - e_p) P(a|b) + e_p n_b(a)      the PTP conditional of the first token
#
# with every n a fresh U(0, 1) vector normalised, one per row (the paper's two-level model is
# e_m = e_c = eps_n). TV_0 = TV(p^ N^, pi) and TV_1 = TV(sum_b m0(b) P^(a|b) N^(b'|a), pi) with
# m0(b) = sum_a p^(a) N^(b|a): one eq. 4 sweep from the NTP window, exact (window_chain).
#
# Units. A row's TV to the truth is linear in its level: TV((1 - e) p + e n, p) = e TV(n, p). So a
# table's measured error -- true-law-weighted row TV, exactly what controlled.sec3_errors reports for a
# trained model (eps_marginal, eps_next_avg, eps_prev_avg) -- is e times that of its pure-noise table,
# and a model's measured (eps_m, eps_c, eps_p) give the levels e_x = eps_x / eps_x(e = 1) exactly, for
# the noise drawn (drawn once: common random numbers for every model and level).
#
# Crossover. TV_0 does not involve e_p, and the k = 1 law is affine in P^, hence in e_p: the mean of
# TV_1 over contexts and draws is convex in e_p, so {e_p : TV_1 < TV_0} is an interval [0, e*) when an
# exact PTP helps at all (TV_1(0) < TV_0). eps_p*(eps_m, eps_c) = e* eps_p(e = 1), found by bisection;
# 0 when TV_1(0) >= TV_0 (RPT cannot help at these NTP errors).
THREE_LEVEL_REPEATS = 8  # noise draws per context
THREE_LEVEL_SEED = 0
UNDECIDED_BAND = 0.05  # within 5% of eps_p*: no sign predicted


class ThreeLevel:
    """The three-level model on one window type's true joints ``[B, A, B']``, strictly positive on the
    tokens each window position can take (the noise lives there too: a trained model's errors do)."""

    def __init__(self, joint: np.ndarray, repeats: int = THREE_LEVEL_REPEATS, seed: int = THREE_LEVEL_SEED):
        if joint.ndim != 3 or (joint <= 0).any():
            raise ValueError("the three-level model needs [B, A, B'] joints, positive on their support")
        rng = np.random.default_rng(seed)
        b, na, nb = joint.shape
        self.joint = np.tile(joint, (repeats, 1, 1))  # draws stacked along the batch: [R * B, A, B']
        self.truth = wc.truth_conditionals(self.joint)

        def noise(shape, axis):
            n = rng.uniform(0.0, 1.0, size=shape)
            return n / n.sum(axis=axis, keepdims=True)

        marg, nxt = noise((repeats * b, na), -1), noise((repeats * b, na, nb), -1)
        prv = noise((repeats * b, na, nb), 1)  # column b: a law of a
        self.noise = wc.WindowConditionals([marg, nxt], [prv, nxt])
        self.unit = mean_eps(sec3_errors(self.noise, self.truth))  # e = 1: every table pure noise

    def levels(self, eps: dict[str, float]) -> tuple[dict[str, float], list[str]]:
        """Measured errors ``{"m", "c", "p"}`` -> levels ``e`` (clipped at 1: eq. 33 cannot make a table
        worse than pure noise; the clipped ones are returned as ``saturated``)."""
        raw = {k: v / self.unit[k] for k, v in eps.items()}
        return {k: min(max(v, 0.0), 1.0) for k, v in raw.items()}, sorted(k for k, v in raw.items() if v > 1.0)

    def conditionals(self, e_m: float, e_c: float, e_p: float) -> wc.WindowConditionals:
        t, n = self.truth, self.noise
        p0 = (1 - e_m) * t.init[0] + e_m * n.init[0]
        nxt = (1 - e_c) * t.init[1] + e_c * n.init[1]
        prv = (1 - e_p) * t.resample[0] + e_p * n.resample[0]
        return wc.WindowConditionals([p0, nxt], [prv, nxt])

    def _tv0_tv1(self, e_m: float, e_c: float) -> tuple[float, Callable[[float], float]]:
        """Mean TV_0, and mean TV_1 as a function of e_p: the k = 1 law's error is ``A + e_p D`` (affine
        in e_p), so two eq. 4 sweeps serve every e_p."""
        at0 = self.conditionals(e_m, e_c, 0.0)
        at1 = self.conditionals(e_m, e_c, 1.0)
        j0 = wc.ntp_joint(at0)
        k1_0, k1_1 = wc.rpt_iteration(j0, at0), wc.rpt_iteration(j0, at1)
        a, d = k1_0 - self.joint, k1_1 - k1_0

        def tv1(e_p: float) -> float:
            return float(0.5 * np.abs(a + e_p * d).reshape(len(a), -1).sum(axis=1).mean())

        return float(wc.tv(j0, self.joint).mean()), tv1

    def predict(self, eps_m: float, eps_c: float, eps_p: float) -> dict:
        """Predicted mean TV_0, TV_1 and TV_1 / TV_0 for a model with these measured errors, and the
        crossover ``eps_p*(eps_m, eps_c)`` its eps_p is compared with."""
        e, saturated = self.levels({"m": eps_m, "c": eps_c, "p": eps_p})
        tv0, tv1_at = self._tv0_tv1(e["m"], e["c"])
        tv1 = tv1_at(e["p"])
        return {"eps": {"m": eps_m, "c": eps_c, "p": eps_p}, "levels": e, "saturated": saturated,
                "tv0": tv0, "tv1": tv1, "tv1_over_tv0": tv1 / tv0, **self._crossover(tv0, tv1_at)}

    def crossover(self, eps_m: float, eps_c: float) -> dict:
        e, _ = self.levels({"m": eps_m, "c": eps_c})
        return self._crossover(*self._tv0_tv1(e["m"], e["c"]))

    def _crossover(self, tv0: float, tv1_at: Callable[[float], float], iters: int = 60) -> dict:
        """``eps_p*`` in measured units: ``above_range`` when even a pure-noise PTP (e_p = 1) still helps."""
        def gap(e_p):
            return tv1_at(e_p) - tv0

        if gap(0.0) >= 0.0:
            return {"eps_p_star": 0.0, "above_range": False}
        if gap(1.0) < 0.0:
            return {"eps_p_star": self.unit["p"], "above_range": True}
        lo, hi = 0.0, 1.0
        for _ in range(iters):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if gap(mid) < 0.0 else (lo, mid)
        return {"eps_p_star": 0.5 * (lo + hi) * self.unit["p"], "above_range": False}


def three_level_sign(eps_p: float, eps_p_star: float, above_range: bool = False,
                     band: float = UNDECIDED_BAND) -> int:
    """The predicted sign of TV_1 - TV_0: -1 below the crossover, +1 above it, 0 (undecided) within
    ``band`` of it (and above ``eps_p*`` when that is only a lower bound, ``above_range``)."""
    if abs(eps_p - eps_p_star) <= band * eps_p_star or (above_range and eps_p > eps_p_star):
        return 0
    return -1 if eps_p < eps_p_star else 1
