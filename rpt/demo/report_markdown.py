"""``report.md``: the demo's report as tables and plots, rendered from ``report.json``'s dict."""

from __future__ import annotations

import json
from pathlib import Path

from rpt.result_files import markdown_table


def render_markdown(rep: dict, out: Path) -> str:
    f = lambda x: f"{x:.4f}" if isinstance(x, float) else ("" if x is None else str(x))  # noqa: E731
    lines = [
        "# RPT demo report", "",
        f"Machine: {rep['machine']}. Stage wall times add up to {rep['total_seconds'] / 60:.1f} min"
        + (f"; this invocation took {rep['wall_seconds'] / 60:.1f} min (stages run two at a time, one "
           "thread each). " if rep.get("wall_seconds") else ". ") +
        f"Corpus: {rep['corpus']['stdlib_files']} stdlib files ({rep['corpus']['train_tokens']:,} train / "
        f"{rep['corpus']['validation_tokens']:,} validation tokens), BPE vocabulary {rep['corpus']['vocab_size']}.", "",
        "## Validation losses (nats/token; the paper's Fig. 5 and its \"NTP barely changes\" claim)", "",
        markdown_table(["model", "steps", "NTP", "PTP-1", "PTP-2"], [
            ["AR-C (pretrained, NTP)", rep["steps"]["ar_c"], f(rep["ar_c_ntp_loss"]), "", ""],
            ["AR-F (AR-C + more NTP)", rep["steps"]["ar_c"] + rep["steps"]["ar_f"], f(rep["ar_f_ntp_loss"]), "", ""],
            ["RPT (AR-C + RPT fine-tune)", rep["steps"]["ar_c"] + rep["steps"]["rpt"], f(rep["ntp_loss"]),
             f(rep["ptp_loss"][0]), f(rep["ptp_loss"][1])],
        ]),
        *(_seed_markdown(rep["seed_study"], rep["steps"]["rpt"]) if "seed_study" in rep else []),
        "![RPT fine-tune losses](rpt/loss_curves.png)", "",
        f"## Error analysis (Table 2): mean TV error 1 - p_k(x_i) after k RPT iterations (w = 2), "
        f"{rep['error_analysis_positions']} validation positions, estimator: {rep['error_analysis_estimator']}", "",
        markdown_table(["PTP step", *rep["tv_by_iters"].keys()],
                       [[rep.get("error_analysis_ptp") or "", *[f(v) for v in rep["tv_by_iters"].values()]]]
                       + ([["sampled PTP (eq. 4 as written)", *[f(v) for v in rep["sampled_ptp"]["tv_by_iters"].values()]]]
                          if rep.get("sampled_ptp") else [])),
        f"Fraction of positions where p_1 > p_0: {f(rep['frac_improved'])}"
        + (f" ({f(rep['sampled_ptp']['frac_improved'])} with sampled PTP)" if rep.get("sampled_ptp") else "") + ".", "",
        *([f"Verdict: {rep['error_analysis_verdict']}.", ""] if rep.get("error_analysis_verdict") else []),
        *([f"Intervals (from the error analysis): `{json.dumps(rep['error_analysis_intervals'])}`", ""]
          if rep.get("error_analysis_intervals") else []),
        "![error analysis](error_analysis.png)", "",
        *([f"How this changes with model size ([docs/scaling.md](../../docs/scaling.md), pre-registered): "
           f"{rep['scaling_study']}.", ""] if rep.get("scaling_study") else []),
        "## Degenerate repetition, greedy decoding (LZ paper Fig. 2)", "",
        "Repetition / frequency: the best rate over each sweep; all settings below.", "",
        markdown_table(["sampler", "degenerate rate"], [[k, f(v)] for k, v in rep["degenerate_rate"].items()]),
        markdown_table(["setting", "degenerate rate", "log-likelihood (nats/token)", "mean new tokens"],
                       [[s["setting"], f(s["degenerate_rate"]), f(s["mean_loglik"]), f(s["mean_new_tokens"])]
                        for s in rep["repetition_settings"]]),
        "![repetition](repetition.png)", "",
        f"## HumanEval, first {rep['humaneval_problems']} problems, greedy (a model this small scores ~0; shown as measured)", "",
        markdown_table(["sampler", "pass@1"], [[k, f(v)] for k, v in rep["humaneval_pass@1"].items()]),
        *_proper_markdown(rep),
        *(_theory_markdown(rep["theory_test"]) if "theory_test" in rep else []),
        *_controlled_markdown(rep["controlled_experiment"]),
        *(_controlled_markdown(rep["controlled_followup"], "the follow-up with a 10x PTP budget", "followup")
          if "controlled_followup" in rep else []),
        *([f"## Where RPT wins: the pre-registered agreement study ({rep['agreement_study']['results']}, not rerun here)",
           "", rep["agreement_study"]["line"], ""] if "agreement_study" in rep else []),
        "## Wall time per stage (s)", "",
        markdown_table(list(rep["stage_seconds"]), [[f"{v:.0f}" for v in rep["stage_seconds"].values()]]),
    ]
    return "\n".join(lines) + "\n"


def _seed_markdown(study: dict, steps: int) -> list[str]:
    f = lambda x: "" if x is None else f"{x:+.4f}"  # noqa: E731
    ci = lambda c: "" if c is None else f"[{c[0]:+.4f}, {c[1]:+.4f}]"  # noqa: E731
    rows = [[what, ", ".join(f(d) for d in c["per_seed"]), f(c["mean"]), ci(c["ci95_seeds"]), ci(c["ci95_batches"]),
             c["observed_sign"]] for what, c in (("RPT NTP - AR-F NTP", study["ntp_gap"]),
                                                  ("RPT PTP-1 - RPT NTP", study["ptp1_minus_ntp"]))]
    return [f"Over training seeds {', '.join(map(str, study['seeds']))} ({steps} fine-tune steps each; the table "
            "above is the first seed's; rpt.studies.seed_study says how each interval is made):", "",
            markdown_table(["difference (nats/token)", "per seed", "mean", "95% CI over seeds (t)",
                            "95% CI over validation batches", "observed sign"], rows)]


def _proper_markdown(rep: dict) -> list[str]:
    """Log / Brier scores by k and acceptance per eta for each error analysis that has them."""
    f = lambda x: "" if x is None else f"{x:.4f}"  # noqa: E731
    rows, acc, pre = [], [], []
    for label, key in ((rep.get("error_analysis_ptp") or "headline", "error_analysis_proper_scores"),
                       ("sampled PTP", "sampled_ptp_proper_scores")):
        ps = rep.get(key) or {}
        if "brier_by_iters" in ps:
            rows += [[label, "log score", *map(f, ps["log_score_by_iters"].values())],
                     [label, "Brier score", *map(f, ps["brier_by_iters"].values())]]
        if "acceptance_by_eta" in ps:
            acc.append([label, *map(f, ps["acceptance_by_eta"].values())])
        if "precondition" in ps:
            pc = ps["precondition"]
            pre.append(f"Precondition ({pc['n_positions']} positions, exact): PTP head loss {pc['ptp_head_loss']:.4f} vs "
                       f"the NTP-implied P* {pc['ntp_implied_loss']:.4f} nats (difference {pc['difference']:+.4f}, 95% CI "
                       f"[{pc['difference_ci'][0]:+.4f}, {pc['difference_ci'][1]:+.4f}]).")
    if not rows:
        return []
    etas = list((rep.get("error_analysis_proper_scores") or {}).get("acceptance_by_eta", {}))
    ks = list(rep["tv_by_iters"])
    return ["## Proper scores beside Table 2 (1 - p rewards the mode; log and Brier do not), lower is better", "",
            markdown_table(["PTP step", "score", *(f"k = {k}" for k in ks)], rows),
            *([markdown_table(["PTP step", *(f"accepted, eta = {e}" for e in etas)], acc)] if acc else []),
            *[line + "\n" for line in pre]]


def _theory_markdown(tt: dict) -> list[str]:
    f = lambda x: "" if x is None else f"{x:.4f}"  # noqa: E731
    rows = [["NTP arm" if a["q"] is None else a["q"], a["seed"], f(a["ratio"]), f(a["tv"]["0"]), f(a["tv"]["1"]),
             f"[{a['diff_ci95'][0]:+.4f}, {a['diff_ci95'][1]:+.4f}]", a["predicted_sign"], a["observed_sign"]]
            for a in tt["arms"]]
    c = tt["crossover"]
    return [f"## Theory test (subset of the pre-registered sweep, {tt['design']}; {tt.get('steps')} steps)", "",
            f"Crossovers from the truth alone (eps_p / eps_n, measured units): noise model {f(c['noise_model'])}, "
            f"shared noise {f(c['shared_noise'])}, Theorem 1 (max-norm) {f(c['theorem1'])}. Predicted sign: -1 "
            f"(RPT closer) below the noise model's r*.", "",
            markdown_table(["q", "seed", "eps_p/eps_n", "TV0", "TV1", "TV1-TV0 95% CI", "predicted", "observed"], rows),
            f"Spearman(r, TV1/TV0): {tt['spearman']}; pure-NTP arm TV0: {f(tt.get('ntp_arm_tv0'))}; "
            f"practical: {tt.get('practical')}.", "", "![theory test](theory_test/theory_test.png)", ""]


def _controlled_markdown(ce: dict, what: str = "a source with a known truth", name: str = "controlled") -> list[str]:
    ci = lambda c: f"[{c[0]:.4f}, {c[1]:.4f}]"  # noqa: E731
    verdict = "yes" if ce["goal_reached"] else "no"
    return [
        f"## Controlled experiment: {what} ({ce['design']})", "",
        f"Metric: {ce['metric']} (lower is better).", "",
        markdown_table(["k", "mean TV", "95% CI"],
                       [[k + (" (NTP)" if k == "0" else ""), f"{v['mean']:.4f}", ci(v["ci95"])] for k, v in ce["k"].items()]),
        f"(k = 1) - (k = 0): {ce['diff_mean']:+.4f}, 95% CI {ci(ce['diff_ci95'])}. RPT closer to the truth with "
        f"the interval excluding zero: **{verdict}**. Learned eps_p / eps_n = {ce['eps_p_over_eps_n']:.2f} "
        f"(Sec. 3: RPT gains when it is small enough; kappa = {ce['kappa']:.2f}).", "",
        f"![controlled experiment](controlled/{name}.png)", "",
    ]

