"""The controlled experiment: the source's truth, the exact window chain, the model queries, the script."""

from __future__ import annotations

import dataclasses
import itertools
import json

import numpy as np
import pytest
import torch

from rpt.studies.controlled import experiment as ctl
from rpt.studies.controlled import hmm as hmm_lib
from rpt.studies.controlled import window_chain as wc
from rpt.studies.controlled.model_conditionals import model_conditionals, model_conditionals_reference
from rpt.studies.controlled.source import Design, write_source
from rpt.studies.sec3.errors import sec3_errors, theory_curve
from rpt.studies.tv_summary import summarise_tv
from tests.helpers.scripts import load_script


@pytest.fixture(scope="module")
def small_hmm() -> hmm_lib.HMM:
    return hmm_lib.random_hmm(hidden=3, vocab=4, seed=5, trans_concentration=0.5, emit_concentration=0.5)


# ---- the source's truth ----------------------------------------------------------------------------
def brute_force_joint(hmm: hmm_lib.HMM, context: list[int], window: int) -> np.ndarray:
    """``p(x_i..x_{i+w-1} | context)`` by summing over every hidden path (independent of the forward pass)."""
    L, V, H = len(context), hmm.vocab, hmm.hidden
    joint = np.zeros([V] * window)
    for states in itertools.product(range(H), repeat=L + window):
        p = hmm.start[states[0]]
        for t in range(1, L + window):
            p *= hmm.trans[states[t - 1], states[t]]
        for t in range(L):
            p *= hmm.emit[states[t], context[t]]
        window_law = np.ones([])
        for j in range(window):  # the window's tokens are independent given the path
            window_law = np.multiply.outer(window_law, hmm.emit[states[L + j]])
        joint += p * window_law
    return joint / joint.sum()


@pytest.mark.parametrize("window", [2, 3])
def test_window_joint_matches_brute_force_over_hidden_paths(small_hmm, window):
    contexts = hmm_lib.sample(small_hmm, 3, 4, seed=1)
    joints = hmm_lib.window_joint(small_hmm, hmm_lib.predictive_states(small_hmm, contexts), window)
    for context, joint in zip(contexts, joints):
        np.testing.assert_allclose(joint, brute_force_joint(small_hmm, list(context), window), atol=1e-12)


def test_token_nll_is_the_chain_rule_of_the_window_joint(small_hmm):
    docs = hmm_lib.sample(small_hmm, 5, 6, seed=2)
    nll = hmm_lib.token_nll(small_hmm, docs)
    for doc, row in zip(docs, nll):
        for t in range(len(doc)):
            marginal = hmm_lib.window_joint(small_hmm, hmm_lib.predictive_states(small_hmm, doc[None, :t]), 1)[0]
            assert row[t] == pytest.approx(-np.log(marginal[doc[t]]), abs=1e-12)


def test_samples_follow_the_source(small_hmm):
    """The empirical law of (x_1, x_2) of 40,000 samples is within sampling noise of the exact one."""
    docs = hmm_lib.sample(small_hmm, 40000, 2, seed=3)
    empirical = np.zeros((4, 4))
    np.add.at(empirical, (docs[:, 0], docs[:, 1]), 1.0)
    exact = hmm_lib.window_joint(small_hmm, small_hmm.start[None], 2)[0]
    # E[TV] of 16 cells at n = 40,000 is about 0.01; 0.03 leaves room without hiding a wrong law.
    assert 0.5 * np.abs(empirical / len(docs) - exact).sum() < 0.03


def test_the_chain_starts_in_its_stationary_law(small_hmm):
    np.testing.assert_allclose(small_hmm.start @ small_hmm.trans, small_hmm.start, atol=1e-12)


# ---- the exact window chain --------------------------------------------------------------------------
def random_conditionals(batch: int, vocab: int, window: int, seed: int) -> wc.WindowConditionals:
    rng = np.random.default_rng(seed)

    def table(shape, axis):
        x = rng.uniform(0.05, 1.0, size=shape)
        return x / x.sum(axis=axis, keepdims=True)

    init = [table([batch] + [vocab] * (j + 1), -1) for j in range(window)]
    resample = [table([batch] + [vocab] * window, 1 + j) for j in range(window - 1)] + [init[-1]]
    return wc.WindowConditionals(init, resample)


def transition_matrix(cond: wc.WindowConditionals, row: int) -> np.ndarray:
    """One RPT sweep as an explicit ``V**w x V**w`` matrix, built state by state with loops."""
    w, v = cond.window, cond.init[0].shape[-1]
    states = list(itertools.product(range(v), repeat=w))
    index = {s: i for i, s in enumerate(states)}
    total = np.eye(len(states))
    for j in range(w):  # PTP for x_0..x_{w-2}, then NTP for x_{w-1}
        step = np.zeros((len(states), len(states)))
        for s in states:
            for new in range(v):
                t = s[:j] + (new,) + s[j + 1:]
                step[index[s], index[t]] = cond.resample[j][(row,) + t]  # C_j(new | the others of s)
        total = total @ step
    return total


@pytest.mark.parametrize("window", [2, 3])
def test_chain_equals_the_explicit_markov_matrix(window):
    cond = random_conditionals(2, 3, window, seed=window)
    joints = wc.joints_by_iters(cond, 3)
    for row in range(2):
        kernel = transition_matrix(cond, row)
        mu = joints[0][row].reshape(-1)
        ntp = cond.init[0][row]
        for j in range(1, window):  # the chain rule, written out
            ntp = ntp[..., None] * cond.init[j][row]
        np.testing.assert_allclose(mu, ntp.reshape(-1), atol=1e-15)
        for k in range(1, 4):
            mu = mu @ kernel
            np.testing.assert_allclose(joints[k][row].reshape(-1), mu, atol=1e-12)


def test_w2_chain_is_eq4_in_matrix_form():
    """w = 2: the law after k iterations is ``[p0 (N P)^k](a) N(b|a)``."""
    cond = random_conditionals(3, 5, 2, seed=7)
    joints = wc.joints_by_iters(cond, 3)
    for row in range(3):
        p0, n, p = cond.init[0][row], cond.init[1][row], cond.resample[0][row].T  # p[b, a] = P(a | b)
        for k in range(4):
            marginal = p0 @ np.linalg.matrix_power(n @ p, k)
            np.testing.assert_allclose(joints[k][row], marginal[:, None] * n, atol=1e-12)


@pytest.mark.parametrize("window", [2, 3])
def test_the_true_conditionals_leave_the_truth_invariant(small_hmm, window):
    """Every step is a Gibbs update of the true joint: k iterations from exact NTP change nothing."""
    contexts = hmm_lib.sample(small_hmm, 8, 5, seed=4)
    joint = hmm_lib.window_joint(small_hmm, hmm_lib.predictive_states(small_hmm, contexts), window)
    for mu in wc.joints_by_iters(wc.truth_conditionals(joint), 3):
        assert wc.tv(mu, joint).max() < 1e-12


def test_stationary_joint_is_the_limit_of_the_iterations():
    cond = random_conditionals(4, 5, 2, seed=11)
    limit = wc.joints_by_iters(cond, 200)[-1]
    np.testing.assert_allclose(ctl.stationary_joint(cond), limit, atol=1e-10)


def test_noise_model_is_eq33():
    cond = random_conditionals(2, 4, 2, seed=3)
    same = wc.noisy_conditionals(cond, 0.0, 0.0, seed=0)
    for a, b in zip(cond.init + cond.resample, same.init + same.resample):
        np.testing.assert_allclose(a, b, atol=1e-15)
    noisy = wc.noisy_conditionals(cond, 0.3, 0.1, seed=0)
    # Rows stay distributions, and a row moves by eps * TV(row, noise) <= eps.
    np.testing.assert_allclose(noisy.resample[0].sum(axis=1), 1.0, atol=1e-12)
    assert np.abs(noisy.resample[0] - cond.resample[0]).sum(axis=1).max() / 2 <= 0.1 + 1e-12
    assert noisy.resample[1] is noisy.init[1]  # the newest token is resampled by the same NTP table


def test_sec3_errors_on_the_paper_example():
    """Hand-computed: V = 2, independent tokens, NTP marginal off by 0.1, PTP rows off by 0.05."""
    truth = wc.WindowConditionals(
        init=[np.array([[0.5, 0.5]]), np.array([[[0.5, 0.5], [0.5, 0.5]]])],
        resample=[np.array([[[0.5, 0.5], [0.5, 0.5]]]), np.array([[[0.5, 0.5], [0.5, 0.5]]])],
    )
    model = wc.WindowConditionals(
        init=[np.array([[0.6, 0.4]]), truth.init[1]],
        resample=[np.array([[[0.55, 0.55], [0.45, 0.45]]]), truth.init[1]],  # P(a | b) = (0.55, 0.45)
    )
    e = sec3_errors(model, truth)
    assert e["eps_marginal"][0] == pytest.approx(0.1)
    assert e["eps_prev_max"][0] == pytest.approx(0.05) and e["eps_prev_avg"][0] == pytest.approx(0.05)
    assert e["eps_next_max"][0] == pytest.approx(0.0)
    assert e["kappa"][0] == pytest.approx(1.0)  # independent tokens: the chain mixes in one step
    # One iteration replaces the marginal by the PTP's: TV 0.1 -> 0.05.
    tv = [wc.tv(j, wc.ntp_joint(truth))[0] for j in wc.joints_by_iters(model, 1)]
    assert tv == pytest.approx([0.1, 0.05])


def test_noise_model_prediction_favours_rpt_when_ptp_is_better(small_hmm):
    design = dataclasses.replace(Design(), contexts=50, context_len=6)
    truth = ctl.truth_for(small_hmm, design)
    curve = theory_curve(truth.cond, truth.joint, 0.1, (0.0, 3.0), 2, seed=0)
    assert curve[0]["tv1_over_tv0"] < 1.0 < curve[1]["tv1_over_tv0"]
    assert curve[0]["measured_ratio"] == 0.0 and curve[1]["measured_ratio"] > 1.0


# ---- statistics ----------------------------------------------------------------------------------------
def test_summary_pairs_the_difference():
    """A constant improvement of 0.01 in every context gives a zero-width difference interval."""
    rng = np.random.default_rng(0)
    base = rng.uniform(0.02, 0.08, size=(2, 1, 300))
    tv = np.concatenate([base, base - 0.01, base - 0.005], axis=1)
    s = summarise_tv(tv)
    assert s["diff_ci95"] == pytest.approx([-0.01, -0.01])
    assert s["diff_1_0"]["frac_contexts_improved"] == 1.0
    assert s["k"]["0"]["ci95"][0] < s["k"]["0"]["mean"] < s["k"]["0"]["ci95"][1]
    assert s["tv_by_iters"]["2"] == pytest.approx(s["tv_by_iters"]["0"] - 0.005)


# ---- the model's conditionals ---------------------------------------------------------------------------
def tiny_rpt(vocab: int, window: int = 3, seed: int = 0):
    from rpt.model import RPTForCausalLM
    from tests.helpers.tiny_models import tiny_llama

    model = RPTForCausalLM.from_base(tiny_llama(vocab_size=vocab, seed=seed, initializer_range=0.4), window)
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        model.offset_embedding.weight.copy_(0.5 * torch.randn(model.offset_embedding.weight.shape, generator=g))
    return model.eval()


@pytest.mark.parametrize("window", [2, 3])
def test_packed_queries_equal_one_full_sequence_per_query(window):
    torch.manual_seed(0)
    model = tiny_rpt(vocab=6)
    contexts = np.random.default_rng(0).integers(0, 4, size=(3, 7))
    fast = model_conditionals(model, contexts, window, vocab=4, batch_size=2)
    slow = model_conditionals_reference(model, contexts, window, vocab=4)
    for a, b in zip(fast.init + fast.resample, slow.init + slow.resample):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_reference_query_is_the_ptp_call_by_hand():
    """PTP-1 of x_i given x_{i+1} = b: context at 0..L-1, b at position L + 1 with offset row 1."""
    model = tiny_rpt(vocab=6)
    context = [1, 3, 0, 2, 2]
    cond = model_conditionals_reference(model, np.array([context]), 2, vocab=4)
    b = 3
    with torch.no_grad():
        logits = model(torch.tensor([context + [b]]), position_ids=torch.tensor([[0, 1, 2, 3, 4, 6]]),
                       offset_ids=torch.tensor([[0, 0, 0, 0, 0, 1]])).logits[0, -1, :4]
    np.testing.assert_allclose(cond.resample[0][0, :, b], torch.softmax(logits.double(), -1).numpy(), atol=1e-6)
    with torch.no_grad():
        ntp = model(torch.tensor([context])).logits[0, -1, :4]
    np.testing.assert_allclose(cond.init[0][0], torch.softmax(ntp.double(), -1).numpy(), atol=1e-6)


# ---- data and script ----------------------------------------------------------------------------------
def test_source_files_tokenise_one_symbol_per_token(tmp_path):
    design = dataclasses.replace(Design(), train_docs=20, val_docs=5, doc_len=12)
    files = write_source(str(tmp_path / "source"), design)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(files.tokenizer)
    assert len(tok) == design.vocab + 2 and tok.eos_token_id == design.vocab
    lines = [json.loads(line)["text"] for line in open(files.train)]
    assert len(lines) == 20
    for text in lines:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert ids == [int(w[1:]) for w in text.split()] and len(ids) == design.doc_len
    saved = json.loads(open(files.hmm).read())
    hmm = hmm_lib.HMM.from_dict(saved["hmm"])
    np.testing.assert_allclose(hmm.emit, design.make_hmm().emit)


def test_script_evaluates_checkpoints(tmp_path, monkeypatch):
    """The evaluate-only path on a random tiny checkpoint: the report's keys and files."""
    script = load_script("eval/controlled.py")
    design = dataclasses.replace(Design(), train_docs=4, val_docs=4, doc_len=16)
    files = write_source(str(tmp_path / "source"), design)
    model = tiny_rpt(vocab=design.vocab + 2, window=2)
    model.save_pretrained(tmp_path / "ckpt")
    out = tmp_path / "out" / "controlled.json"
    code = script.main(["--source", files.dir, "--checkpoints", str(tmp_path / "ckpt"), "--contexts", "40",
                        "--out", str(out)])
    assert code == 0
    summary = json.loads(out.read_text())
    assert summary["lower_is_better"] is True and isinstance(summary["metric"], str)
    assert set(summary["k"]) == {"0", "1", "2"}
    for k in ("0", "1", "2"):
        lo, hi = summary["k"][k]["ci95"]
        assert lo <= summary["k"][k]["mean"] <= hi
    lo, hi = summary["diff_ci95"]
    assert lo <= summary["diff_1_0"]["mean"] <= hi
    assert summary["tv_by_iters"]["1"] == summary["k"]["1"]["mean"]
    assert summary["contexts"] == 40 and summary["source"]["information_next_about_current"] > 0
    assert out.with_suffix(".md").exists() and out.with_suffix(".png").exists()


def test_script_rejects_checkpoints_without_a_source(capsys):
    script = load_script("eval/controlled.py")
    assert script.main(["--checkpoints", "x"]) == 2
    assert "--source" in capsys.readouterr().err
