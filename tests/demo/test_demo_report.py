"""``rpt.demo``'s report: every number comes from the stage results, the controlled experiment included."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from rpt import demo
from rpt.demo.stages import side_by_side


def fake_stages(tmp_path) -> demo.Stages:
    stages = demo.Stages(tmp_path)
    ev = lambda ntp, p1=None, p2=None: {"eval_ntp_loss": ntp, "eval_ptp_loss_1": p1, "eval_ptp_loss_2": p2}  # noqa: E731
    stages.results = {
        "corpus": {"stdlib_files": 10, "validation_files": 1, "vocab_size": 4096, "seq_len": 128,
                   "train_tokens": 1000, "validation_tokens": 100},
        "ar_c": {"steps": 400, "last_eval": ev(3.5)},
        "ar_f": {"steps": 800, "last_eval": ev(2.90)},
        "rpt": {"steps": 800, "last_eval": ev(2.93, 2.7, 2.8)},
        "error_analysis": {"tv_by_iters": {"0": 0.79, "1": 0.78}, "frac_improved": 0.5, "n_positions": 2000,
                           "estimator": "top-16", "tv_ci95_by_iters": {"0": [0.78, 0.80]}, "diff_ci95": [-0.02, -0.001],
                           "ptp": {"label": "greedy PTP, confidence 0.9"}},
        "error_analysis_sampled": {"tv_by_iters": {"0": 0.79, "1": 0.81}, "frac_improved": 0.3,
                                   "tv_change_1_0_ci": [0.01, 0.03]},
        "repetition": {"degenerate_rate": {"none": 0.3, "lz": 0.06}, "settings": []},
        "humaneval": {"ntp": {"pass@1": 0.0}},
        "controlled": {
            "metric": "TV", "lower_is_better": True, "contexts": 1000, "seeds": [0, 1],
            "k": {"0": {"mean": 0.04, "ci95": [0.039, 0.041]}, "1": {"mean": 0.03, "ci95": [0.029, 0.031]},
                  "2": {"mean": 0.03, "ci95": [0.029, 0.031]}},
            "tv_by_iters": {"0": 0.04, "1": 0.03, "2": 0.03},
            "diff_1_0": {"mean": -0.01, "ci95": [-0.011, -0.009]}, "diff_ci95": [-0.011, -0.009],
            "goal_reached": True, "eps_ratios": {"prev_avg/next_avg": 0.8}, "eps": {"kappa": 1.5},
        },
    }
    stages.seconds = {name: 1.0 for name in stages.results}
    return stages


def test_report_carries_the_controlled_experiment_and_the_intervals(tmp_path):
    stages = fake_stages(tmp_path)
    report = demo.build_report(tmp_path, stages, argparse.Namespace(humaneval_limit=8))
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved == json.loads(json.dumps(report))
    ce = saved["controlled_experiment"]
    assert ce["metric"] == "TV" and ce["lower_is_better"] is True
    assert set(ce["k"]) == {"0", "1", "2"} and all(set(v) == {"mean", "ci95"} for v in ce["k"].values())
    assert ce["diff_ci95"] == [-0.011, -0.009] and ce["tv_by_iters"]["1"] < ce["tv_by_iters"]["0"]
    assert ce["eps_p_over_eps_n"] == 0.8
    # The error analysis's own intervals are passed through; its point estimates stay where they were.
    assert saved["error_analysis_intervals"] == {"tv_ci95_by_iters": {"0": [0.78, 0.80]}, "diff_ci95": [-0.02, -0.001]}
    assert saved["tv_by_iters"] == {"0": 0.79, "1": 0.78}
    assert saved["error_analysis_ptp"] == "greedy PTP, confidence 0.9"
    assert saved["sampled_ptp"] == {"tv_by_iters": {"0": 0.79, "1": 0.81}, "frac_improved": 0.3,
                                    "intervals": {"tv_change_1_0_ci": [0.01, 0.03]}}
    md = (tmp_path / "report.md").read_text()
    assert "Controlled experiment" in md and "[-0.0110, -0.0090]" in md and "controlled/controlled.png" in md
    assert "| greedy PTP, confidence 0.9 | 0.7900 | 0.7800 |" in md and "| sampled PTP (eq. 4 as written) | 0.7900 | 0.8100 |" in md
    # the committed agreement study's trade-off, one line read from docs/agreement.json (not a stage)
    line = saved["agreement_study"]["line"]
    assert "TV1 0.0698 vs pure-NTP TV0 0.1028: -0.0330 = RPT sampling -0.0184 (negative in 5 of 5 seeds)" in line
    assert "+ RPT training -0.0146 (seed interval [-0.0299, +0.0007])" in line and "67% of the gain is training" in line
    assert line in md and "docs/agreement.md" in md


def test_side_by_side_stages_run_at_once_and_are_cached(tmp_path):
    """Two stages started together overlap in time, each result lands in its own stage file."""
    stages = demo.Stages(tmp_path)
    runs = {}
    for name in ("a", "b"):
        stamp = tmp_path / f"{name}.json"
        code = (f"import json, time; t = time.time(); time.sleep(1.0); "
                f"json.dump([t, time.time()], open({str(stamp)!r}, 'w'))")
        runs[name] = ([sys.executable, "-c", code], tmp_path / f"{name}.log", lambda p=stamp: json.loads(p.read_text()))
    side_by_side(stages, runs)
    (a0, a1), (b0, b1) = stages.results["a"], stages.results["b"]
    assert max(a0, b0) < min(a1, b1)  # both were running at the same time
    again = demo.Stages(tmp_path)
    side_by_side(again, {name: (["false"], tmp_path / "x.log", lambda: None) for name in runs})  # cached
    assert again.results == stages.results


def test_background_stage_is_collected_once_and_cached(tmp_path):
    stages = demo.Stages(tmp_path)
    out_json = tmp_path / "bg" / "result.json"
    cmd = [sys.executable, "-c", f"import json; json.dump({{'x': 1}}, open({str(out_json)!r}, 'w'))"]
    collect = lambda: json.loads(out_json.read_text())  # noqa: E731
    pending = stages.start("bg", cmd, out_json.with_suffix(".log"), collect)
    assert stages.finish("bg", pending) == {"x": 1}
    assert stages.start("bg", cmd, out_json.with_suffix(".log"), collect) is None  # cached: not started again
    again = demo.Stages(tmp_path)
    assert again.finish("bg", None) == {"x": 1} and again.seconds["bg"] == stages.seconds["bg"]


def test_background_stage_time_ends_with_its_process(tmp_path):
    stages = demo.Stages(tmp_path)
    pending = stages.start("quick", [sys.executable, "-c", "pass"], tmp_path / "quick.log", lambda: "done")
    time.sleep(3.0)  # the demo is busy elsewhere before it collects the stage
    assert stages.finish("quick", pending) == "done"
    assert stages.seconds["quick"] < 2.5


def test_background_stage_stops_with_its_children(tmp_path):
    """A demo that fails early must not leave the background run (or what it started) behind."""
    stages = demo.Stages(tmp_path)
    pid_file = tmp_path / "child.pid"
    script = (f"import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              f"open({str(pid_file)!r}, 'w').write(str(c.pid)); time.sleep(60)")
    pending = stages.start("bg", [sys.executable, "-c", script], tmp_path / "never.log", lambda: None)
    for _ in range(200):
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.05)
    child = int(pid_file.read_text())
    pending.stop()
    assert pending.proc.returncode is not None
    for _ in range(100):  # the grandchild got SIGTERM with the group
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        raise AssertionError("the background stage's child survived stop()")


def test_report_carries_the_theory_test_and_the_proper_scores(tmp_path):
    stages = fake_stages(tmp_path)
    arm = lambda q, r, tv0, tv1, ci, pred, obs: {"q": q, "seed": 0, "ratio": r, "tv": {"0": tv0, "1": tv1},  # noqa: E731
                                                 "diff_ci95": ci, "predicted_sign": pred, "observed_sign": obs,
                                                 "tv1_over_tv0": tv1 / tv0, "shrunk_curve": [{"t": 0.0}]}
    stages.results["theory_test"] = {
        "crossover": {"noise_model": 1.43, "shared_noise": 1.05, "theorem1": 0.35},
        "arms": [arm(0.1, 2.0, 0.04, 0.06, [0.01, 0.03], 1, 1), arm(0.3, 1.2, 0.04, 0.0401, [-0.001, 0.0012], -1, 0),
                 arm(1.0, 0.7, 0.05, 0.045, [-0.006, -0.004], -1, -1), arm(None, 3.0, 0.039, 0.08, [0.03, 0.05], 1, 1)],
        "spearman": 1.0, "ntp_arm_tv0": 0.039, "practical": {"rpt_beats_ntp_arm": False}, "curves": {"x": []},
        "design": {"steps": 600}}
    scores = {"log_score_by_iters": {"0": 3.1, "1": 3.2}, "brier_by_iters": {"0": 0.71, "1": 0.72},
              "log_score_ci_by_iters": {"0": [3.0, 3.2], "1": [3.1, 3.3]},
              "brier_ci_by_iters": {"0": [0.7, 0.72], "1": [0.71, 0.73]},
              "acceptance_by_eta": {"0.0": 1.0, "0.5": 0.4, "0.7": 0.2, "0.9": 0.05}}
    stages.results["error_analysis"].update(scores)
    stages.results["error_analysis_sampled"].update(scores, precondition={
        "n_positions": 100, "ptp_head_loss": 3.0, "ntp_implied_loss": 2.9, "difference": 0.1, "difference_ci": [0.05, 0.15],
        "head_beats_implied": False})
    demo.build_report(tmp_path, stages, argparse.Namespace(humaneval_limit=8))
    saved = json.loads((tmp_path / "report.json").read_text())
    tt = saved["theory_test"]
    assert len(tt["arms"]) >= 3 and tt["crossover"]["noise_model"] == 1.43 and tt["ntp_arm_tv0"] == 0.039
    assert "curves" not in tt and all("shrunk_curve" not in a for a in tt["arms"])  # curves stay in the plot
    for a in tt["arms"]:
        lo, hi = a["diff_ci95"]
        assert a["observed_sign"] == (0 if lo <= 0 <= hi else (1 if lo > 0 else -1))
        assert {"q", "seed", "ratio", "tv", "diff_ci95", "predicted_sign", "observed_sign"} <= set(a)
    ps = saved["error_analysis_proper_scores"]
    assert ps["acceptance_by_eta"]["0.9"] == 0.05 and ps["brier_by_iters"]["1"] == 0.72
    assert saved["sampled_ptp_proper_scores"]["precondition"]["ntp_implied_loss"] == 2.9
    md = (tmp_path / "report.md").read_text()
    assert "Theory test" in md and "| NTP arm |" in md and "Brier score" in md and "accepted, eta = 0.9" in md
    assert "NTP-implied P* 2.9000" in md
