"""The theory test (docs/theory_test_preregistration.md): crossovers, signs and the sweep's summary, on tiny instances."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from rpt.studies.controlled import experiment as ctl
from rpt.studies.controlled import hmm as hmm_lib
from rpt.studies.controlled import theory_prediction as tt
from rpt.studies.controlled import window_chain as wc
from rpt.studies.controlled.source import Design, SourceFiles
from rpt.studies.sec3.errors import sec3_errors


@pytest.fixture(scope="module")
def truth() -> ctl.Truth:
    hmm = hmm_lib.random_hmm(hidden=3, vocab=4, seed=5, trans_concentration=0.5, emit_concentration=0.5)
    return ctl.truth_for(hmm, dataclasses.replace(Design(), contexts=60, context_len=6))


def test_shared_noise_adds_one_vector_to_every_row(truth):
    eps = 0.3
    noisy = tt.shared_noisy_conditionals(truth.cond, 0.2, eps, seed=1)
    added = (noisy.resample[0] - (1 - eps) * truth.cond.resample[0]) / eps  # [B, a', b]: the noise, per row b
    assert np.allclose(added, added[:, :, :1])  # the same vector for every conditioning token
    assert np.allclose(added.sum(axis=1), 1.0) and (added > 0).all()
    for table, axis in ((noisy.init[0], 1), (noisy.init[1], 2), (noisy.resample[0], 1)):
        assert np.allclose(table.sum(axis=axis), 1.0)
    assert noisy.resample[1] is noisy.init[1]  # the newest token reuses its NTP table


def test_crossover_interpolates_the_bracketing_points():
    curve = [{"ratio": 2.0, "tv1_over_tv0": 1.1}, {"ratio": 0.0, "tv1_over_tv0": 0.5},
             {"ratio": 1.0, "tv1_over_tv0": 0.9}]  # unsorted on purpose
    assert tt.crossover(curve) == pytest.approx(1.5)  # 0.9 -> 1.1 between 1 and 2: halfway
    assert tt.crossover([{"ratio": 0.0, "tv1_over_tv0": 0.5}, {"ratio": 1.0, "tv1_over_tv0": 0.8}]) is None


def test_theorem1_crossover_is_rho_equal_one():
    # rho = kappa (r + 1) / 2 with ||eps_i|| = ||eps_{i+1|i}||: rho = 1 at r = 2 / kappa - 1.
    for kappa in (1.0, 1.48, 2.0):
        r = tt.theorem1_crossover(np.full(5, kappa))
        assert kappa * (r + 1.0) / 2.0 == pytest.approx(1.0)


def test_noise_crossovers_bracket_where_rpt_stops_helping(truth):
    cross = tt.crossovers(truth, eps_n=0.1, seed=0)
    for name in ("noise_model", "shared_noise"):
        r = cross[name]
        assert r is not None and 0.2 < r < 3.0
        pts = sorted((p["ratio"], p["tv1_over_tv0"]) for p in cross["curves"][name])
        assert pts[0][1] < 1.0 < pts[-1][1]
        # An independent check of the crossing: a fresh noise draw just below r* helps on average, far above hurts.
        make = tt.shared_noisy_conditionals if name == "shared_noise" else wc.noisy_conditionals
        below = make(truth.cond, 0.1, 0.1 * 0.5 * r, seed=99)
        j0, j1 = wc.joints_by_iters(below, 1)
        assert wc.tv(j1, truth.joint).mean() < wc.tv(j0, truth.joint).mean()


def test_shrunk_curve_ends_at_the_model_and_starts_at_the_true_ptp(truth):
    model = wc.noisy_conditionals(truth.cond, 0.1, 0.2, seed=3)
    curve = {round(p["t"], 2): p for p in tt.shrunk_curve(model, truth.cond, truth.joint, ts=(0.0, 1.0))}
    j0, j1 = wc.joints_by_iters(model, 1)  # the model itself, computed apart
    assert curve[1.0]["tv1_over_tv0"] == pytest.approx(wc.tv(j1, truth.joint).mean() / wc.tv(j0, truth.joint).mean())
    errs = sec3_errors(model, truth.cond)
    assert curve[1.0]["ratio"] == pytest.approx(errs["eps_prev_avg"].mean() / errs["eps_next_avg"].mean())
    assert curve[0.0]["ratio"] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize(("ci", "sign"), [([-0.2, -0.1], -1), ([0.1, 0.3], 1), ([-0.1, 0.1], 0), ([0.0, 0.2], 0)])
def test_observed_sign_follows_the_interval(ci, sign):
    assert tt.observed_sign(ci) == sign


def test_predicted_sign_is_the_side_of_the_crossover():
    assert tt.predicted_sign(1.0, 1.43) == -1 and tt.predicted_sign(2.0, 1.43) == 1


def _fake_result(rng, n, shift, ratio):
    tv0 = rng.uniform(0.02, 0.06, n)
    errors = {"eps_prev_avg": np.full(n, ratio), "eps_next_avg": np.ones(n), "eps_prev_max": np.ones(n),
              "eps_next_max": np.ones(n), "eps_marginal": np.ones(n), "kl_prev": np.ones(n), "kl_next": np.ones(n)}
    return {"tv": np.stack([tv0, tv0 + shift + rng.normal(0, 0.002, n)]), "errors": errors}


def test_summary_signs_spearman_and_practical(truth):
    rng = np.random.default_rng(0)
    cross = {"noise_model": 1.4, "shared_noise": 1.05, "theorem1": 0.35}
    arms, tvs = [], {}
    plan = [(0.1, 2.5, 0.02), (0.3, 1.2, 0.0), (1.0, 0.6, -0.01), (None, 3.0, 0.03)]
    for (q, ratio, shift), seed in itertools.product(plan, (0, 1)):
        res = _fake_result(rng, 300, shift, ratio + 0.01 * seed)
        arms.append(tt.arm_entry(q, seed, res, cross["noise_model"], truth))
        tvs.setdefault(q, []).append(res["tv"])
    out = tt.summarise(cross, arms, tvs)
    for a in out["arms"]:  # every observed sign agrees with its own interval
        lo, hi = a["diff_ci95"]
        assert a["observed_sign"] == (0 if lo <= 0 <= hi else (1 if lo > 0 else -1))
    by_q = {(a["q"], a["seed"]): a for a in out["arms"]}
    assert by_q[0.1, 0]["observed_sign"] == 1 and by_q[1.0, 0]["observed_sign"] == -1
    assert by_q[0.1, 0]["predicted_sign"] == 1 and by_q[1.0, 1]["predicted_sign"] == -1
    # Spearman against a brute-force rank correlation (no ties here).
    rpt_arms = [a for a in out["arms"] if a["q"] is not None]
    rx = np.argsort(np.argsort([a["ratio"] for a in rpt_arms]))
    ry = np.argsort(np.argsort([a["tv1_over_tv0"] for a in rpt_arms]))
    assert out["spearman"] == pytest.approx(np.corrcoef(rx, ry)[0, 1])
    assert out["ntp_arm_tv0"] == pytest.approx(np.mean([tvs[None][s][0].mean() for s in (0, 1)]))
    p = out["practical"]
    assert p["best_q"] == 1.0 and p["best_rpt_tv1"] == pytest.approx(np.mean([t[1].mean() for t in tvs[1.0]]))
    assert p["diff_ci95"][0] <= p["diff"] <= p["diff_ci95"][1]
    assert [x["q"] for x in out["pooled"]] == [0.1, 0.3, 1.0, None]
    assert out["confirms"]["refuted"] is False and out["confirms"]["spearman_positive"] is True


def test_sweep_jobs_one_run_per_arm_and_seed(tmp_path):
    from rpt.studies.controlled import run as script

    files = SourceFiles(str(tmp_path / "source"))
    jobs = script.sweep_jobs(tmp_path, files, [0.1, 1.0], [0, 1], 50, ntp_arm=True)
    assert [(q, s) for q, s, _ in jobs] == [(0.1, 0), (1.0, 0), (None, 0), (0.1, 1), (1.0, 1), (None, 1)]
    for q, s, job in jobs:
        assert job.config == "configs/controlled_sweep.yaml" and f"seed={s}" in job.overrides
        assert "max_steps=50" in job.overrides
        assert ("objective=ntp" in job.overrides) == (q is None) and (f"q={q}" in job.overrides) == (q is not None)
    assert len({j.run_dir for *_, j in jobs}) == 6
    assert script.config_steps(script.SWEEP_CONFIG) == 1400  # the pre-registered budget


def test_table2_metric_is_improper_and_log_brier_are_proper():
    truth = np.array([[0.6, 0.4]])
    onehot, honest = np.array([[1.0, 0.0]]), truth
    s_hot, s_true = tt.marginal_scores(onehot, truth), tt.marginal_scores(honest, truth)
    assert s_hot["table2"] == pytest.approx(0.4) and s_true["table2"] == pytest.approx(0.48)  # by hand
    assert s_hot["brier"] == pytest.approx(0.6 * 0.0 + 0.4 * 2.0)  # x = 0: (0, 0); x = 1: 1 + 1
    assert s_true["log"] == pytest.approx(-(0.6 * np.log(0.6) + 0.4 * np.log(0.4)))
    for q in np.linspace(0.01, 0.99, 25):  # the truth minimises both proper scores
        s = tt.marginal_scores(np.array([[q, 1 - q]]), truth)
        assert s["log"] >= s_true["log"] - 1e-12 and s["brier"] >= s_true["brier"] - 1e-12


def test_acceptance_against_a_loop(truth):
    model = wc.noisy_conditionals(truth.cond, 0.2, 0.3, seed=4)
    acc = tt.acceptance_by_eta(model, etas=(0.0, 0.3, 0.5))
    n = len(truth.contexts)
    for eta in (0.0, 0.3, 0.5):
        greedy = sampled = 0.0
        for c in range(n):
            joint = model.init[0][c][:, None] * model.init[1][c]
            for b in range(joint.shape[1]):
                row = model.resample[0][c][:, b]  # P(. | b)
                greedy += joint[:, b].sum() * (row.max() > eta) / n
                sampled += joint[:, b].sum() * row[row > eta].sum() / n
        assert acc[str(eta)]["greedy"] == pytest.approx(greedy) and acc[str(eta)]["sampled"] == pytest.approx(sampled)
    assert acc["0.0"]["sampled"] == pytest.approx(1.0)


def test_implied_ptp_of_the_truth_is_the_true_ptp(truth):
    assert np.allclose(tt.implied_ptp(truth.cond), truth.cond.resample[0])
    pre = tt.precondition(truth.cond, truth.joint)
    assert pre["ptp_head"] == pytest.approx(pre["truth"]) and pre["ntp_implied"] == pytest.approx(pre["truth"])
    worse = wc.noisy_conditionals(truth.cond, 0.0, 0.5, seed=2)  # NTP exact, PTP noisy: the implied one wins
    pre = tt.precondition(worse, truth.joint)
    assert pre["ntp_implied"] == pytest.approx(pre["truth"]) and pre["head_beats_implied"] is False


def test_evaluate_arms_on_tiny_models_writes_every_field():
    from tests.studies.test_controlled import tiny_rpt

    design = dataclasses.replace(Design(), contexts=12, context_len=8)
    small = ctl.truth_for(design.make_hmm(), design)
    cross = {"noise_model": 1.4, "shared_noise": 1.05, "theorem1": 0.35, "curves": {}, "kappa_mean": 1.5}
    models = {name: tiny_rpt(vocab=design.vocab + 2, window=2, seed=i) for i, name in enumerate("abc")}
    out = tt.evaluate_arms(design, small, [(0.3, 0, "a"), (0.3, 1, "b"), (None, 0, "c")], cross, load=models.__getitem__)
    assert len(out["arms"]) == 3 and "ntp_arm_tv0" in out and "practical" in out
    for a in out["arms"]:
        assert {"q", "seed", "ratio", "tv", "diff_ci95", "predicted_sign", "observed_sign", "scores", "acceptance",
                "precondition", "shrunk_curve"} <= set(a)
        assert a["observed_sign"] == tt.observed_sign(a["diff_ci95"])
        assert a["scores"]["truth"]["log"] <= a["scores"]["0"]["log"]  # the truth is the best log score


def test_markdown_tables_cover_scores_and_losses(truth):
    rng = np.random.default_rng(1)
    cross = {"noise_model": 1.4, "shared_noise": 1.05, "theorem1": 0.35}
    res = _fake_result(rng, 50, 0.01, 2.0)
    model = wc.noisy_conditionals(truth.cond, 0.1, 0.2, seed=0)
    a = tt.arm_entry(0.3, 0, res, 1.4, truth)
    a.update(tt.scores_entry(model, truth), losses={"eval_ntp_loss": 2.55, "eval_ptp_loss_1": 2.56})
    tables = tt.markdown_tables(tt.summarise(cross, [a], {0.3: [res["tv"]]}))
    headers = [h[0] for h, _ in tables]
    assert headers == ["q", "q", "crossover", "q", "q"]
    assert tables[-1][1][0][-1] == "0.0100"  # PTP-1 - NTP
    # the scores table does not depend on the sweep having recorded losses
    del a["losses"]
    tables = tt.markdown_tables(tt.summarise(cross, [a], {0.3: [res["tv"]]}))
    assert [h[0] for h, _ in tables] == ["q", "q", "crossover", "q"] and "Brier, k 0 -> 1" in tables[-1][0]
