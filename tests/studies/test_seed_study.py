"""Intervals over training seeds and validation batches (rpt.studies.seed_study), checked by hand and by
exact enumeration of the bootstrap's resamples."""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from rpt import demo
from rpt.studies import seed_study as sd


def write_run(path: Path, sums, counts, batches=None) -> Path:
    """A run directory holding only ``eval_batches.json`` (kinds: ntp, ptp_1)."""
    path.mkdir(parents=True)
    (path / "eval_batches.json").write_text(json.dumps({
        "step": 10, "batch": list(range(len(sums))) if batches is None else batches,
        "sum": sums, "count": counts, "kinds": ["ntp", "ptp_1"]}))
    return path


def test_mean_loss_is_token_weighted(tmp_path):
    run = sd.read_batches(write_run(tmp_path / "r", [[10.0, 3.0], [2.0, 1.0]], [[4, 1], [1, 1]]))
    assert sd.mean_loss(run, "ntp") == pytest.approx(12 / 5)  # not (2.5 + 2) / 2
    assert sd.mean_loss(run, "ptp_1") == pytest.approx(2.0)


def ratio_of(run, idx) -> float:
    return sum(run["sum"][i, 0] for i in idx) / sum(run["count"][i, 0] for i in idx)


def test_batch_interval_matches_exact_enumeration_of_resamples(tmp_path):
    counts = [[5, 5], [3, 3], [4, 4]]
    a = sd.read_batches(write_run(tmp_path / "a", [[10.0, 0], [9.0, 0], [4.0, 0]], counts))
    b = sd.read_batches(write_run(tmp_path / "b", [[11.0, 0], [6.0, 0], [8.0, 0]], counts))
    # every one of the 27 equally likely resamples of 3 batches, the statistic computed directly
    stats = []
    for idx in itertools.product(range(3), repeat=3):
        stats.append(ratio_of(b, idx) - ratio_of(a, idx))
    weights = np.ones(27) / 27
    order = np.argsort(stats)
    cdf = np.cumsum(weights[order])
    exact_lo, exact_hi = np.asarray(stats)[order][np.searchsorted(cdf, 0.025)], np.asarray(stats)[order][np.searchsorted(cdf, 0.975)]
    lo, hi = sd.batch_interval([(a, "ntp", b, "ntp")], resamples=20000)
    # the bootstrap's quantiles fall on (or between) the exact distribution's atoms next to them
    atoms = np.unique(np.round(stats, 12))
    assert lo == pytest.approx(exact_lo, abs=np.diff(atoms).max()) and hi == pytest.approx(exact_hi, abs=np.diff(atoms).max())
    assert min(stats) <= lo <= hi <= max(stats)


def test_a_constant_difference_has_a_point_interval_and_a_sign(tmp_path):
    rng = np.random.default_rng(0)
    counts = rng.integers(50, 100, size=(20, 1)).repeat(2, 1).astype(float)  # PTP-1 targets as many as NTP's
    arms = {"ar_f": [], "rpt": []}
    for seed in (0, 1):
        ntp = rng.normal(3.0, 0.3, size=20) * counts[:, 0]
        # RPT: NTP exactly 0.02 above AR-F's on every batch, PTP-1 0.01 below its own NTP
        arms["ar_f"].append(write_run(tmp_path / f"ar_f{seed}", np.stack([ntp, ntp], 1).tolist(), counts.tolist()))
        rpt_ntp = ntp + 0.02 * counts[:, 0]
        rpt_ptp = (rpt_ntp / counts[:, 0] - 0.01) * counts[:, 1]
        arms["rpt"].append(write_run(tmp_path / f"rpt{seed}", np.stack([rpt_ntp, rpt_ptp], 1).tolist(), counts.tolist()))
    study = sd.seed_study(arms, [0, 1])
    gap = study["ntp_gap"]
    assert gap["per_seed"] == pytest.approx([0.02, 0.02]) and gap["ci95_batches"] == pytest.approx([0.02, 0.02])
    assert gap["ci95_seeds"] == pytest.approx([0.02, 0.02]) and gap["observed_sign"] == 1
    assert study["ptp1_minus_ntp"]["mean"] == pytest.approx(-0.01) and study["ptp1_minus_ntp"]["observed_sign"] == -1
    assert study["losses"]["rpt_ntp"][0] - study["losses"]["ar_f_ntp"][0] == pytest.approx(0.02)


def test_seeds_that_disagree_give_sign_zero(tmp_path):
    counts = [[10, 10]] * 4
    runs = [sd.read_batches(write_run(tmp_path / f"r{i}", [[30.0 + i, 0]] * 4, counts)) for i in range(4)]
    # seed 0: +0.1, seed 1: -0.1 -> the batches interval excludes 0 for each seed but the seeds' does not
    out = sd.compare([runs[0], runs[1]], "ntp", [runs[1], runs[0]], "ntp")
    assert out["per_seed"] == pytest.approx([0.1, -0.1]) and out["observed_sign"] == 0
    assert out["ci95_seeds"][0] < 0 < out["ci95_seeds"][1]


def test_unpaired_runs_are_refused(tmp_path):
    a = sd.read_batches(write_run(tmp_path / "a", [[1.0, 0]] * 3, [[1, 1]] * 3))
    b = sd.read_batches(write_run(tmp_path / "b", [[1.0, 0]] * 3, [[1, 1]] * 3, batches=[0, 1, 3]))
    with pytest.raises(ValueError, match="same validation batches"):
        sd.compare([a], "ntp", [b], "ntp")
    with pytest.raises(FileNotFoundError, match="eval_batches.json"):
        sd.read_batches(tmp_path / "missing")


def test_demo_fine_tunes_one_pair_per_seed(tmp_path):
    cmds = demo.fine_tune_commands(tmp_path, "ar_c/final", 400, [0, 1])
    assert list(cmds) == ["ar_f", "rpt", "ar_f_seed1", "rpt_seed1"]
    for name, cmd in cmds.items():
        seed = 1 if name.endswith("seed1") else 0
        assert f"seed={seed}" in cmd and "max_steps=400" in cmd and f"output_dir={tmp_path / name}" in cmd
        assert ("configs/tiny_finetune.yaml" in cmd) == name.startswith("rpt")
    with pytest.raises(SystemExit):
        demo.main(["--out", str(tmp_path / "x"), "--finetune-seeds", "0", "0"])


def test_report_carries_the_seed_study(tmp_path):
    from tests.demo.test_demo_report import fake_stages

    stages = fake_stages(tmp_path)
    stages.results["seed_study"] = {
        "seeds": [0, 1], "losses": {"ar_f_ntp": [2.90, 2.95], "rpt_ntp": [2.93, 2.97], "rpt_ptp_1": [2.7, 2.8]},
        "ntp_gap": {"per_seed": [0.03, 0.02], "mean": 0.025, "ci95_seeds": [-0.04, 0.09],
                    "ci95_batches": [0.02, 0.03], "observed_sign": 0},
        "ptp1_minus_ntp": {"per_seed": [-0.23, -0.17], "mean": -0.2, "ci95_seeds": [-0.58, 0.18],
                           "ci95_batches": [-0.21, -0.19], "observed_sign": 0}}
    demo.build_report(tmp_path, stages, argparse.Namespace(humaneval_limit=8))
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["seed_study"]["ntp_gap"]["ci95_seeds"] == [-0.04, 0.09]
    md = (tmp_path / "report.md").read_text()
    assert "| RPT NTP - AR-F NTP | +0.0300, +0.0200 | +0.0250 | [-0.0400, +0.0900] | [+0.0200, +0.0300] | 0 |" in md
