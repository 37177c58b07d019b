"""``report.json``: the demo's report built from the stage results (every number read from what a
stage wrote), with the summaries it keeps of the controlled experiment, the theory test and the
proper scores, the committed agreement study's trade-off line (read from docs/agreement.json) and one
line read from the committed scaling study (docs/scaling.json, how the demo's error analysis changes
with model size); ``report.md`` is rendered from it (:mod:`rpt.demo.report_markdown`)."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from rpt.demo.processes import ROOT
from rpt.demo.report_markdown import render_markdown
from rpt.demo.stages import Stages
from rpt.demo.study_lines import agreement_tradeoff
from rpt.result_files import write_json, write_text


def _intervals(summary: dict) -> dict:
    """Every interval an evaluation JSON carries (keys naming a CI / interval), for the report."""
    return {k: v for k, v in summary.items() if any(t in k.lower() for t in ("ci95", "interval", "_ci"))}


def controlled_summary(ce: dict) -> dict:
    """The report's ``controlled_experiment``: metric, direction, k -> mean and 95% CI, the
    interval of (k = 1) - (k = 0), and what Sec. 3 says explains the outcome."""
    return {
        "metric": ce["metric"],
        "lower_is_better": ce["lower_is_better"],
        "k": ce["k"],
        "diff_ci95": ce["diff_ci95"],
        "diff_mean": ce["diff_1_0"]["mean"],
        "tv_by_iters": ce["tv_by_iters"],
        "goal_reached": ce["goal_reached"],
        "eps_p_over_eps_n": ce.get("eps_ratios", {}).get("prev_avg/next_avg"),
        "kappa": ce.get("eps", {}).get("kappa"),
        "contexts": ce["contexts"],
        "seeds": ce["seeds"],
        "design": "docs/controlled_experiment.md",
    }


PROPER_KEYS = ("log_score_by_iters", "log_score_ci_by_iters", "brier_by_iters", "brier_ci_by_iters",
               "acceptance_by_eta", "precondition")


def proper_scores(ea: dict) -> dict:
    """Beside Table 2's improper 1 - p: the log and Brier scores by k, the acceptance rate of the
    first PTP step per eta, and (when run) the PTP head against the NTP-implied P*."""
    return {k: ea[k] for k in PROPER_KEYS if k in ea}


THEORY_ARM_KEYS = ("q", "seed", "ratio", "tv", "diff_ci95", "predicted_sign", "observed_sign", "tv1_over_tv0",
                   "shrunk_crossover", "scores", "acceptance", "precondition")


def theory_summary(tt: dict) -> dict:
    """The report's ``theory_test``: the sweep summary without its curves (they are in the plot)."""
    return {"crossover": tt["crossover"], "arms": [{k: a[k] for k in THEORY_ARM_KEYS if k in a} for a in tt["arms"]],
            "spearman": tt["spearman"], "ntp_arm_tv0": tt.get("ntp_arm_tv0"), "practical": tt.get("practical"),
            "confirms": tt.get("confirms"), "steps": tt.get("design", {}).get("steps"),
            "design": "docs/theory_test_preregistration.md"}


def scaling_study_line(path: Path = ROOT / "docs" / "scaling.json") -> str:
    """The committed scaling study's one line (docs/scaling.md), or what to run for it."""
    from rpt.studies.scaling.report import one_line  # late: torch, for one line

    if not path.is_file():
        return "not run yet: `python eval/scaling.py` writes docs/scaling.{json,md,png}"
    return one_line(json.loads(path.read_text(encoding="utf-8")))


def build_report(out: Path, stages: Stages, args) -> dict:
    r = stages.results
    rpt_eval, arf_eval = r["rpt"]["last_eval"], r["ar_f"]["last_eval"]
    ea, rep = r["error_analysis"], r["repetition"]
    agreement = agreement_tradeoff()  # the committed study's results, not a stage of this demo
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.python_implementation()} {platform.python_version()}",
        "corpus": r["corpus"],
        "steps": {"ar_c": r["ar_c"]["steps"], "ar_f": r["ar_f"]["steps"], "rpt": r["rpt"]["steps"]},
        "ntp_loss": rpt_eval["eval_ntp_loss"],
        "ar_f_ntp_loss": arf_eval["eval_ntp_loss"],
        "ar_c_ntp_loss": r["ar_c"]["last_eval"]["eval_ntp_loss"],
        "ptp_loss": [rpt_eval.get(f"eval_ptp_loss_{k}") for k in (1, 2)],  # PTP-2: None when w = 2
        "tv_by_iters": ea["tv_by_iters"],
        "frac_improved": ea["frac_improved"],
        "error_analysis_positions": ea["n_positions"],
        "error_analysis_estimator": ea.get("estimator"),
        "error_analysis_intervals": _intervals(ea),
        "error_analysis_ptp": ea.get("ptp", {}).get("label"),
        "error_analysis_verdict": ea.get("tv_change_1_0_verdict"),
        **({"sampled_ptp": {"tv_by_iters": r["error_analysis_sampled"]["tv_by_iters"],
                            "frac_improved": r["error_analysis_sampled"]["frac_improved"],
                            "intervals": _intervals(r["error_analysis_sampled"])}}
           if "error_analysis_sampled" in r else {}),
        "degenerate_rate": rep["degenerate_rate"],
        "repetition_settings": rep["settings"],
        "humaneval_pass@1": {name: res["pass@1"] for name, res in r["humaneval"].items()},
        "humaneval_problems": args.humaneval_limit,
        "error_analysis_proper_scores": proper_scores(ea),
        **({"sampled_ptp_proper_scores": proper_scores(r["error_analysis_sampled"])} if "error_analysis_sampled" in r else {}),
        **({"theory_test": theory_summary(r["theory_test"])} if "theory_test" in r else {}),
        **({"seed_study": r["seed_study"]} if "seed_study" in r else {}),
        "controlled_experiment": controlled_summary(r["controlled"]),
        **({"controlled_followup": controlled_summary(r["controlled_followup"])} if "controlled_followup" in r else {}),
        **({"agreement_study": agreement} if agreement else {}),
        "scaling_study": scaling_study_line(),
        "stage_seconds": stages.seconds,
        "total_seconds": sum(stages.seconds.values()),
        # The wall time of the invocation that wrote this report (cached stages cost ~0 here;
        # stages run two at a time, so this is below the sum above).
        "wall_seconds": getattr(args, "wall_seconds", None),
    }
    write_json(out / "report.json", report)
    write_text(out / "report.md", render_markdown(report, out))
    return report

