"""The synthetic NTP-vs-RPT experiment: the paper's finding, exactness checks, the script's outputs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rpt.studies.sec3 import synthetic as syn
from tests.helpers.scripts import load_script

FIELDS = {"name", "eps_n", "eps_p", "tv_ntp_mean", "tv_rpt_mean", "max_ntp_mean", "max_rpt_mean", "frac_rpt_better"}


@pytest.fixture(scope="module")
def draws() -> syn.Draws:
    return syn.draw(200, seed=1)


@pytest.mark.parametrize("eps_n", [1.0, 0.1, 0.01])
def test_rpt_error_is_below_ntp_in_the_three_cases(draws, eps_n):
    results = [r.summary() for r in syn.run_noise_level(draws, eps_n)]
    assert [r["name"] for r in results] == ["oracle", "medium", "low"]
    assert [r["eps_p"] for r in results] == pytest.approx([0.0, 0.5 * eps_n, 0.75 * eps_n])
    for r in results:
        assert r["tv_rpt_mean"] < r["tv_ntp_mean"]
        assert r["max_rpt_mean"] < r["max_ntp_mean"]
        assert r["frac_rpt_better"] > 0.9
    # A noisier PTP helps less: the TV error grows with eps_p / eps_n.
    assert results[0]["tv_rpt_mean"] < results[1]["tv_rpt_mean"] < results[2]["tv_rpt_mean"]


def test_errors_scale_linearly_with_the_noise_level(draws):
    big, small = syn.run_noise_level(draws, 1.0), syn.run_noise_level(draws, 0.01)
    for b, s in zip(big, small):
        ratio_big = b.tv_rpt.mean() / b.tv_ntp.mean()
        ratio_small = s.tv_rpt.mean() / s.tv_ntp.mean()
        assert ratio_small == pytest.approx(ratio_big, rel=0.05)  # "invariant to absolute noise level"


def test_exact_conditionals_reproduce_the_ground_truth(draws):
    case = syn.run_case(draws, "exact", eps_n=0.0, eps_p=0.0)
    assert case.tv_ntp.max() < 1e-12 and case.tv_rpt.max() < 1e-12


def test_noisy_conditionals_are_distributions(draws):
    marginal, next_cond, prev_cond = syn.conditionals(draws.pi)
    np.testing.assert_allclose(marginal.sum(1), 1.0)
    np.testing.assert_allclose(next_cond.sum(2), 1.0)
    np.testing.assert_allclose(prev_cond.sum(2), 1.0)
    np.testing.assert_allclose(syn.noisy(prev_cond, draws.noise_prev, 0.3).sum(2), 1.0)
    # P[b, a] = pi(a | b): reconstruct the joint from the column marginal.
    np.testing.assert_allclose(np.swapaxes(prev_cond * draws.pi.sum(1)[:, :, None], 1, 2), draws.pi)


def test_reduced_stationary_law_equals_the_full_pair_kernel():
    small = syn.draw(6, vocab=4, seed=3)
    _, next_cond, prev_cond = syn.conditionals(small.pi)
    hat_next = syn.noisy(next_cond, small.noise_next, 0.7)
    hat_prev = syn.noisy(prev_cond, small.noise_prev, 0.4)
    kernel = syn.rpt_kernel(hat_next, hat_prev)
    np.testing.assert_allclose(kernel.sum(2), 1.0)
    mu = np.full((6, 16), 1 / 16)
    for _ in range(500):  # power iteration on the V^2-state chain of eq. 27
        mu = np.einsum("ts,tsu->tu", mu, kernel)
    np.testing.assert_allclose(syn.rpt_joint(hat_next, hat_prev).reshape(6, 16), mu, atol=1e-12)
    stationary = syn.stationary(kernel)
    np.testing.assert_allclose(np.einsum("ts,tsu->tu", stationary, kernel), stationary, atol=1e-12)


def test_same_seed_same_numbers_other_seed_other_numbers():
    a = syn.run_case(syn.draw(20, seed=5), "low", 1.0, 0.75).summary()
    b = syn.run_case(syn.draw(20, seed=5), "low", 1.0, 0.75).summary()
    c = syn.run_case(syn.draw(20, seed=6), "low", 1.0, 0.75).summary()
    assert a == b and a != c


def test_script_writes_json_table_and_histograms(tmp_path, capsys):
    out = tmp_path / "syn.json"
    assert load_script("eval/synthetic.py").main(["--trials", "60", "--seed", "2", "--out", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["trials"] == 60 and summary["vocab"] == 20
    assert [c["name"] for c in summary["cases"]] == ["oracle", "medium", "low"]
    assert all(set(c) == FIELDS and c["eps_n"] == 1.0 for c in summary["cases"])
    assert sorted({c["eps_n"] for c in summary["noise_levels"]}) == [0.01, 0.1]
    assert len(summary["noise_levels"]) == 6
    assert all(c["tv_rpt_mean"] < c["tv_ntp_mean"] for c in summary["cases"] + summary["noise_levels"])
    for suffix in (".png", ".eps_n_0.1.png", ".eps_n_0.01.png"):
        assert (tmp_path / f"syn{suffix}").read_bytes()[:4] == b"\x89PNG"
    assert "| oracle | 1 | 0 |" in (tmp_path / "syn.md").read_text()
    assert str(out) in capsys.readouterr().out
