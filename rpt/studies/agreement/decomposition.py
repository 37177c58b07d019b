"""The agreement study's gap decomposed: how much of RPT's win over pure-NTP sampling is RPT
*sampling* and how much is what RPT *training* does to the NTP head. An addendum to the registered
analysis: it decides nothing registered (docs/agreement_preregistration.md).

Per RPT arm, window type (tag-first, content-first, pooled) and training seed, with ``TV_k`` a
model's mean TV over the contexts at ``k`` RPT iterations and seed ``s`` of the RPT arm paired with
seed ``s`` of the pure-NTP arm (the same data order):

* **gap** = RPT TV1 - NTP TV0 (P2's difference on tag-first windows);
* **sampling effect** = RPT TV1 - RPT TV0 (one RPT iteration against the same model's NTP sampling);
* **training effect** = RPT TV0 - NTP TV0 (the RPT-trained NTP head against the pure-NTP one);

so gap = sampling + training, seed by seed and context by context. Each effect is given with
Student's t interval over the seed pairs (from the per-seed means alone, which the results record)
and, where the per-context TVs are at hand, the paired bootstrap over contexts (seeds fixed, contexts
resampled jointly across them, as P2's) and the two-way bootstrap over seeds and contexts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rpt.statistics import bootstrap_ci, bootstrap_ci_seeds_and_contexts, t_interval

RPT_ARMS = ("rpt_q0.3", "rpt_q0.1")
BASELINE = "ntp"
WINDOWS = ("tag_first", "content_first", "pooled")
# effect -> (the RPT arm?, k) minus (the RPT arm?, k); False: the pure-NTP arm
EFFECTS = {"gap": ((True, 1), (False, 0)), "sampling": ((True, 1), (True, 0)), "training": ((True, 0), (False, 0))}
RESAMPLES = 10000


def per_seed_tv(models: Sequence[dict], arm: str, window: str, k: int, seeds: Sequence[int]) -> np.ndarray:
    """``[S]`` one arm's mean TV_k per seed (in ``seeds``' order) from the results' model entries;
    pooled = the two window types' means averaged (equal to the mean of the pooled per-context TVs)."""
    by_seed = {e["seed"]: e["windows"] for e in models if e["arm"] == arm}
    missing = [s for s in seeds if s not in by_seed]
    if missing:
        raise ValueError(f"the results have no {arm} model for seeds {missing}: the decomposition pairs every "
                         "RPT seed with the NTP model of the same seed")
    key = f"tv{k}"
    if window == "pooled":
        return np.array([0.5 * (by_seed[s]["tag_first"][key] + by_seed[s]["content_first"][key]) for s in seeds])
    return np.array([by_seed[s][window][key] for s in seeds])


def per_context_tv(tvs: dict, arm: str, window: str, k: int) -> np.ndarray:
    """``[S, n]`` from the study's ``tvs[arm][window]`` (``[S, 2, n]``, seeds in the results' order)."""
    by = tvs[arm]
    if window == "pooled":
        return 0.5 * (np.asarray(by["tag_first"])[:, k] + np.asarray(by["content_first"])[:, k])
    return np.asarray(by[window])[:, k]


def decompose(models: Sequence[dict], seeds: Sequence[int], tvs: dict | None = None,
              resamples: int = RESAMPLES) -> dict:
    """``out[rpt_arm][window][effect]``: ``mean``, ``per_seed``, ``negative_seeds``, ``ci95_seeds``
    (Student t over the seed pairs) and, where the per-context ``tvs`` (seeds in ``seeds``' order)
    hold the arm and the baseline, ``ci95_contexts`` (seeds fixed) and ``ci95_seeds_and_contexts``
    (both resampled); plus ``training_share`` = training / gap (of the means)."""
    out: dict = {}
    for arm in RPT_ARMS:
        if not any(e["arm"] == arm for e in models):
            continue
        contexts = tvs is not None and arm in tvs and BASELINE in tvs
        for w_index, window in enumerate(WINDOWS):
            row = {}
            for e_index, (effect, terms) in enumerate(EFFECTS.items()):
                (arm_a, k_a), (arm_b, k_b) = [(arm if rpt else BASELINE, k) for rpt, k in terms]
                diff = per_seed_tv(models, arm_a, window, k_a, seeds) - per_seed_tv(models, arm_b, window, k_b, seeds)
                r = {"mean": float(diff.mean()), "per_seed": [float(x) for x in diff],
                     "negative_seeds": int((diff < 0).sum()), "ci95_seeds": t_interval(diff)}
                if contexts:
                    ctx = per_context_tv(tvs, arm_a, window, k_a) - per_context_tv(tvs, arm_b, window, k_b)
                    seed = 100 + 10 * w_index + e_index  # a fixed stream per row and effect
                    r["ci95_contexts"] = bootstrap_ci(ctx, resamples=resamples, seed=seed)
                    r["ci95_seeds_and_contexts"] = bootstrap_ci_seeds_and_contexts(ctx, resamples=resamples, seed=seed)
                row[effect] = r
            row["training_share"] = row["training"]["mean"] / row["gap"]["mean"] if row["gap"]["mean"] else None
            out.setdefault(arm, {})[window] = row
    return out


def add_recorded_context_intervals(decomposition: dict, summary: dict) -> None:
    """Where the per-context TVs are not at hand, the context intervals the results recorded for the same
    quantities: the sampling effect is the arm table's TV1 - TV0 (``arms``), the q = 0.3 gap is P2's
    (tag-first) and the co-primary's (pooled) difference. Marked ``ci95_contexts_from``."""
    arms = {(a["arm"], a["window"]): a for a in summary.get("arms", [])}
    recorded = {("rpt_q0.3", "tag_first"): ("P2", summary["predictions"]["P2"]),
                ("rpt_q0.3", "pooled"): ("co-primary", summary["predictions"]["co_primary"])}
    for arm, by_window in decomposition.items():
        for window, row in by_window.items():
            if "ci95_contexts" not in row["sampling"] and (arm, window) in arms:
                row["sampling"].update(ci95_contexts=arms[arm, window]["diff"]["ci95"], ci95_contexts_from="arm table")
            if "ci95_contexts" not in row["gap"] and (arm, window) in recorded:
                name, prediction = recorded[arm, window]
                row["gap"].update(ci95_contexts=prediction["ci95_contexts"], ci95_contexts_from=name)


def check_per_context(models: Sequence[dict], seeds: Sequence[int], tvs: dict, tolerance: float = 1e-9) -> float:
    """The largest difference between a model's recorded mean TV_k and the mean of its per-context TVs
    in ``tvs`` (over the arms ``tvs`` holds); a ``ValueError`` above ``tolerance``: those are not the
    per-context values of the recorded models."""
    worst = 0.0
    for arm, by_window in tvs.items():
        for window in ("tag_first", "content_first"):
            for k in (0, 1):
                recorded = per_seed_tv(models, arm, window, k, seeds)
                worst = max(worst, float(np.abs(np.asarray(by_window[window])[:, k].mean(axis=1) - recorded).max()))
    if worst > tolerance:
        raise ValueError(f"the per-context TVs differ from the recorded model means by up to {worst:.3g} (> {tolerance:g}): "
                         "they are not the recorded models' values; score the recorded checkpoints, or retrain them "
                         "with the registered keying on the same CPU")
    return worst


# ---- report ------------------------------------------------------------------------------------------
def _ci(c) -> str:
    return "" if c is None else f"[{c[0]:+.4f}, {c[1]:+.4f}]"


def _fmt_effect(r: dict) -> str:
    extra = "".join(f", {label} {_ci(r[key])}" for key, label in (("ci95_contexts", "contexts"),
                    ("ci95_seeds_and_contexts", "seeds and contexts")) if r.get(key) is not None)
    return f"{r['mean']:+.4f} (seeds {_ci(r['ci95_seeds'])}{extra}; negative in {r['negative_seeds']} of {len(r['per_seed'])} seeds)"


def _change(x: float) -> str:
    return f"{'costs' if x > 0 else 'gains'} {x:+.4f}"


def _resolved(r: dict) -> str:
    ci = r["ci95_seeds"]
    return "its seed interval includes 0" if ci is None or ci[0] <= 0 <= ci[1] else "its seed interval excludes 0"


def summary_lines(decomposition: dict) -> list[str]:
    """The decomposition's reading in sentences, every word of direction taken from its numbers."""
    lines = []
    q3 = decomposition.get("rpt_q0.3")
    if q3:
        tag, pool, content = q3["tag_first"], q3["pooled"], q3["content_first"]
        lines.append(f"* **Tag-first windows, q = 0.3 (P2)**: the gap {_fmt_effect(tag['gap'])} is a sampling effect "
                     f"{_fmt_effect(tag['sampling'])} plus a training effect {_fmt_effect(tag['training'])}: "
                     f"{_resolved(tag['training'])}.")
        lines.append(f"* **Pooled over window types, q = 0.3**: gap {pool['gap']['mean']:+.4f} = sampling "
                     f"{pool['sampling']['mean']:+.4f} + training {pool['training']['mean']:+.4f}: the training effect is "
                     f"{pool['training_share']:.0%} of the gap. On content-first windows sampling "
                     f"{_change(content['sampling']['mean'])} and training {_change(content['training']['mean'])}.")
    q1 = decomposition.get("rpt_q0.1")
    if q1:
        tag = q1["tag_first"]
        lines.append(f"* **q = 0.1**: training effect on tag-first windows {_fmt_effect(tag['training'])}: "
                     f"{_resolved(tag['training'])}; sampling {_change(tag['sampling']['mean'])} there and "
                     f"{_change(q1['content_first']['sampling']['mean'])} on content-first windows.")
    return lines


def table(decomposition: dict) -> tuple[list[str], list[list]]:
    """One row per RPT arm, window type and effect."""
    headers = ["RPT arm", "window", "effect", "mean", "per seed", "seeds < 0", "95% CI seeds (t)",
               "95% CI contexts (seeds fixed)", "95% CI seeds and contexts (two-way bootstrap)", "training / gap"]
    rows = []
    for arm, by_window in decomposition.items():
        for window, row in by_window.items():
            for effect in EFFECTS:
                r = row[effect]
                share = row["training_share"] if effect == "gap" and row["training_share"] is not None else None
                rows.append([arm, window, effect, f"{r['mean']:+.4f}", " ".join(f"{x:+.4f}" for x in r["per_seed"]),
                             f"{r['negative_seeds']}/{len(r['per_seed'])}", _ci(r["ci95_seeds"]),
                             _ci(r.get("ci95_contexts")), _ci(r.get("ci95_seeds_and_contexts")),
                             "" if share is None else f"{share:.2f}"])
    return headers, rows
