"""The paper's error analysis (Table 2, Fig. 6): chain math, batched model queries, the top-m
estimator and the script end to end."""

from __future__ import annotations

import importlib.util
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rpt.model import RPTForCausalLM
from rpt.studies.error_analysis import analysis as ea
from tests.helpers.scripts import load_script
from tests.helpers.tiny_models import tiny_llama

VOCAB = 30
ITERS = 3


def random_rpt(vocab: int, seed: int = 0, head_gain: float = 3.0) -> RPTForCausalLM:
    """A tiny Llama whose context, positions and mask all matter, with a random offset table (so
    PTP-1 differs from NTP).

    A freshly initialised model (std 0.02) attends almost uniformly and its residual stream is
    dominated by the offset row: wrong positions or a leaky mask would go unnoticed. So every
    matrix is redrawn with std ``2 / sqrt(fan_in)`` (embeddings and the table: std 1), and the
    output head with ``head_gain / sqrt(fan_in)``, which makes the distributions peaked like a
    trained model's.
    """
    model = RPTForCausalLM.from_base(tiny_llama(vocab_size=vocab, seed=seed, tie_word_embeddings=False), window=2)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 2:
                gain = 1.0 if "embed" in name else (head_gain if "lm_head" in name else 2.0) / param.shape[1] ** 0.5
                param.copy_(torch.randn(param.shape, generator=g) * gain)
    return model.eval()


def random_distributions(g: torch.Generator, *shape: int) -> torch.Tensor:
    x = torch.rand(*shape, generator=g, dtype=torch.float64) ** 3  # cubed: uneven, like real conditionals
    return x / x.sum(-1, keepdim=True)


@torch.no_grad()
def naive_truth_probs(model, context: list[int], truth: int, iters: int = ITERS) -> list[float]:
    """One full forward per (position, token): no batching, no cache, no custom mask."""
    c, vocab = len(context), model.config.vocab_size

    def last(tokens, **kw):
        return torch.softmax(model(torch.tensor([tokens]), **kw).logits[0, -1].double(), dim=-1)

    p0 = last(context)
    next_cond = torch.stack([last(context + [a]) for a in range(vocab)])
    # PTP-1: x_{i+1} = b at its own position c + 1 (0-based), offset row 1, after x_<i.
    ptp = {"position_ids": torch.tensor([list(range(c)) + [c + 1]]),
           "offset_ids": torch.tensor([[0] * c + [1]]), "use_cache": False}
    prev_cond = torch.stack([last(context + [b], **ptp) for b in range(vocab)])
    out, p = [float(p0[truth])], p0
    for _ in range(iters):
        p = (p @ next_cond) @ prev_cond
        out.append(float(p[truth]))
    return out


# ---- (1) the chain ---------------------------------------------------------------------------------
def test_chain_marginals_equal_the_pair_chain_by_brute_force():
    """p_k from the V-state recursion equals the x_i-marginal of the (a, b) pair chain of eq. 4."""
    g = torch.Generator().manual_seed(0)
    batch, na, nb = 3, 4, 5
    p0 = random_distributions(g, batch, na)
    next_cond = random_distributions(g, batch, na, nb)
    prev_cond = random_distributions(g, batch, nb, na)
    fast = ea.chain_marginals(p0, next_cond, prev_cond, ITERS)
    assert fast.shape == (batch, ITERS + 1, na)
    for j in range(batch):
        states = list(itertools.product(range(na), range(nb)))
        joint = np.array([float(p0[j, a] * next_cond[j, a, b]) for a, b in states])  # NTP start
        # One iteration: x_i' ~ P(.|x_{i+1}), then x_{i+1}' ~ N(.|x_i').
        kernel = np.array([[float(prev_cond[j, b, a2] * next_cond[j, a2, b2]) for a2, b2 in states]
                           for _, b in states])
        for k in range(ITERS + 1):
            marginal = joint.reshape(na, nb).sum(axis=1)
            np.testing.assert_allclose(fast[j, k].numpy(), marginal, rtol=1e-12, atol=1e-14)
            joint = joint @ kernel
    assert not torch.allclose(fast[:, 0], fast[:, 1])  # the iterations do move the marginal


@pytest.mark.parametrize("greedy, confidence", [(True, 0.0), (True, 0.3), (False, 0.25)])
def test_ptp_rule_marginals_equal_the_pair_chain_by_brute_force(greedy, confidence):
    """Greedy / thresholded PTP (the sampler's rule): the V-state recursion equals the x_i-marginal
    of the (a, b) pair chain written out move by move, as the sampler acts."""
    g = torch.Generator().manual_seed(3)
    batch, na, nb = 3, 4, 5
    p0 = random_distributions(g, batch, na)
    next_cond = random_distributions(g, batch, na, nb)
    # Peaked PTP rows so that some pass the threshold and some do not.
    prev_cond = torch.softmax(3 * torch.randn(batch, nb, na, generator=g, dtype=torch.float64), dim=-1)
    rule = ea.PTPRule(greedy=greedy, confidence=confidence)
    fast = ea.chain_marginals(p0, next_cond, prev_cond, ITERS, rule)
    for j in range(batch):
        states = list(itertools.product(range(na), range(nb)))
        joint = np.array([float(p0[j, a] * next_cond[j, a, b]) for a, b in states])
        kernel = np.zeros((len(states), len(states)))
        for s1, (a, b) in enumerate(states):
            row = prev_cond[j, b].tolist()
            proposals = [(row.index(max(row)), 1.0)] if greedy else list(enumerate(row))
            for a_new, chance in proposals:
                a2 = a_new if row[a_new] > confidence else a  # below the threshold: keep x_i
                for b2 in range(nb):
                    kernel[s1, a2 * nb + b2] += chance * float(next_cond[j, a2, b2])
        for k in range(ITERS + 1):
            np.testing.assert_allclose(fast[j, k].numpy(), joint.reshape(na, nb).sum(axis=1), rtol=1e-12, atol=1e-14)
            joint = joint @ kernel
    assert not torch.allclose(fast[:, 0], fast[:, 1])


def test_sampled_rule_without_threshold_is_the_plain_chain():
    g = torch.Generator().manual_seed(4)
    p0, n, p = random_distributions(g, 2, 6), random_distributions(g, 2, 6, 6), random_distributions(g, 2, 6, 6)
    plain = torch.stack([p0, ((p0.unsqueeze(-2) @ n) @ p).squeeze(-2)], dim=-2)
    torch.testing.assert_close(ea.chain_marginals(p0, n, p, 1, ea.PTPRule()), plain, rtol=1e-12, atol=1e-14)


# ---- (2) batched, cached queries against the naive model calls ---------------------------------------
@pytest.fixture(scope="module")
def model() -> RPTForCausalLM:
    return random_rpt(VOCAB)


@pytest.fixture(scope="module")
def positions(model) -> tuple[list[list[int]], list[int]]:
    """Random contexts of different lengths (so the batch is left-padded), truths drawn from NTP."""
    g = torch.Generator().manual_seed(1)
    contexts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (20, 27, 21, 33, 24, 20, 30, 25)]
    with torch.no_grad():
        truths = [int(torch.multinomial(torch.softmax(model(torch.tensor([c])).logits[0, -1], -1), 1, generator=g))
                  for c in contexts]
    return contexts, truths


def test_exact_batched_computation_equals_naive_model_calls(model, positions):
    contexts, truths = positions[0][:4], positions[1][:4]
    got = ea.truth_probabilities(model, contexts, truths, iters=ITERS, chunk=7)  # chunks: scratch columns reused
    want = torch.tensor([naive_truth_probs(model, c, y) for c, y in zip(contexts, truths)], dtype=torch.float64)
    torch.testing.assert_close(got.probs, want, rtol=1e-4, atol=1e-6)
    assert torch.equal(got.coverage, torch.ones_like(got.coverage))
    # PTP really differs from NTP here, so the check above exercises the offset row and position.
    assert (want[:, 1] - want[:, 0]).abs().max() > 1e-3


def test_ptp_query_sees_the_context_not_the_other_queries(model, positions):
    """A query's distribution must not depend on which other queries share its call."""
    enc = ea.encode_contexts(model, positions[0][:3])
    both = ea.query_tokens(model, enc, torch.tensor([[4, 9]] * 3), shift=1, row=ea.PTP1_ROW)
    alone = ea.query_tokens(model, enc, torch.tensor([[9]] * 3), shift=1, row=ea.PTP1_ROW)
    torch.testing.assert_close(both[:, 1], alone[:, 0], rtol=1e-5, atol=1e-7)
    again = ea.query_tokens(model, enc, torch.tensor([[9]] * 3), shift=1, row=ea.PTP1_ROW)
    torch.testing.assert_close(again, alone, rtol=0, atol=0)  # earlier calls' scratch columns are never seen


@pytest.mark.parametrize("attn", ["eager", "flex_attention", "flash_attention_2"])
def test_queries_under_every_attention_implementation(model, positions, attn):
    """eager takes the 4D mask as sdpa does; flex / flash attention run the queries with sdpa."""
    contexts, truths = positions[0][:3], positions[1][:3]
    want = ea.truth_probabilities(model, contexts, truths, iters=1).probs
    old = model.lm.config._attn_implementation
    model.lm.config._attn_implementation = attn
    try:
        got = ea.truth_probabilities(model, contexts, truths, iters=1).probs
    finally:
        model.lm.config._attn_implementation = old
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    model.lm.config._attn_implementation = "paged|sdpa"
    try:
        with pytest.raises(ValueError, match="sdpa"):
            ea.truth_probabilities(model, contexts, truths, iters=1)
    finally:
        model.lm.config._attn_implementation = old


# ---- (3) the top-m estimator -------------------------------------------------------------------------
@pytest.mark.parametrize("rule", [ea.PTPRule(greedy=True, confidence=0.0), ea.PTPRule(greedy=True, confidence=0.06),
                                  ea.PTPRule(greedy=False, confidence=0.05)], ids=["greedy", "greedy-eta", "sampled-eta"])
def test_top_m_with_m_equal_v_is_exact_for_every_ptp_rule(model, positions, rule):
    contexts, truths = positions
    exact = ea.truth_probabilities(model, contexts, truths, iters=ITERS, rule=rule).probs
    full = ea.truth_probabilities(model, contexts, truths, iters=ITERS, top_m=VOCAB, rule=rule).probs
    torch.testing.assert_close(full, exact, rtol=1e-5, atol=1e-6)  # float32 query order
    assert not torch.allclose(exact, ea.truth_probabilities(model, contexts, truths, iters=ITERS).probs)


def test_top_m_with_m_equal_v_is_exact(model, positions):
    contexts, truths = positions
    exact = ea.truth_probabilities(model, contexts, truths, iters=ITERS)
    full = ea.truth_probabilities(model, contexts, truths, iters=ITERS, top_m=VOCAB)
    torch.testing.assert_close(full.probs, exact.probs, rtol=1e-5, atol=1e-7)  # float32 query order
    torch.testing.assert_close(full.coverage, torch.ones_like(full.coverage))
    assert full.bound.max() < 1e-9


def test_top_m_is_close_for_moderate_m_and_its_bound_holds(model, positions):
    contexts, truths = positions
    exact = ea.truth_probabilities(model, contexts, truths, iters=ITERS).probs
    errors, bounds = {}, {}
    for m in (4, 10, 15, 20):
        est = ea.truth_probabilities(model, contexts, truths, iters=ITERS, top_m=m)
        errors[m] = float((est.probs - exact).abs().mean(0).max())  # worst k of the mean |error|
        bounds[m] = float(est.bound[:, -1].mean())
        # The bound is certified: it holds at every position, every k, for every m.
        assert ((est.probs - exact).abs() <= est.bound + 1e-7).all(), m
        torch.testing.assert_close(est.probs[:, 0], exact[:, 0], rtol=1e-5, atol=1e-7)  # k = 0: p0 itself
        assert (est.coverage > 0).all() and (est.coverage <= 1 + 1e-9).all()
    assert errors[15] < 0.01 and errors[10] < 0.02, errors
    assert errors[20] < errors[4], errors
    assert bounds[20] < bounds[15] < bounds[10] < bounds[4], bounds
    # E_1 is the mass dropped from x_i's marginal plus the mass dropped from x_{i+1}'s.
    one = ea.truth_probabilities(model, contexts, truths, iters=1, top_m=10)
    torch.testing.assert_close(one.bound[:, 1], 2.0 - one.coverage.sum(1))
    # Means over positions, as reported in Table 2.
    est = ea.truth_probabilities(model, contexts, truths, iters=ITERS, top_m=15).probs
    np.testing.assert_allclose((1 - est).mean(0).numpy(), (1 - exact).mean(0).numpy(), atol=0.01)


def test_top_m_bound_holds_for_greedy_ptp_with_confidence(model, positions):
    contexts, truths = positions
    rule = ea.PTPRule(greedy=True, confidence=0.06)
    exact = ea.truth_probabilities(model, contexts, truths, iters=ITERS, rule=rule).probs
    errors = {}
    for m in (4, 10, 15, 20):
        est = ea.truth_probabilities(model, contexts, truths, iters=ITERS, top_m=m, rule=rule)
        assert ((est.probs - exact).abs() <= est.bound + 1e-7).all(), m
        errors[m] = float((est.probs - exact).abs().mean(0).max())
    assert errors[15] < 0.02 and errors[20] < errors[4], errors


# ---- positions and summary ---------------------------------------------------------------------------
def test_sample_positions_are_deterministic_and_have_context():
    lengths = [5, 40, 0, 25, 100]
    all_pos = ea.sample_positions(lengths, min_context=20, limit=None, seed=0)
    assert len(all_pos) == 20 + 5 + 80
    assert all(t >= 20 and t < lengths[d] for d, t in all_pos)
    picked = ea.sample_positions(lengths, 20, limit=30, seed=3)
    assert picked == ea.sample_positions(lengths, 20, limit=30, seed=3)
    assert picked != ea.sample_positions(lengths, 20, limit=30, seed=4)
    assert len(set(picked)) == 30 and picked == sorted(picked) and set(picked) <= set(all_pos)


def test_summary_numbers():
    probs = np.array([[0.2, 0.5, 0.6, 0.6], [0.4, 0.3, 0.3, 0.3], [0.1, 0.2, 0.2, 0.2], [0.5, 0.5, 0.5, 0.5]])
    s = ea.summarise(probs)
    assert s["n_positions"] == 4
    assert s["tv_by_iters"] == pytest.approx({"0": 0.7, "1": 0.625, "2": 0.6, "3": 0.6})
    assert s["frac_improved"] == 0.5  # strict: the tie at position 4 does not count
    assert sum(s["histogram"]["counts"]) == 4 and len(s["histogram"]["bin_edges"]) == ea.HISTOGRAM_BINS + 1
    assert s["tv_change_1_0"] == pytest.approx(0.625 - 0.7)
    for lo, hi in [*s["tv_ci_by_iters"].values(), s["tv_change_1_0_ci"], s["frac_improved_ci"]]:
        assert lo <= hi
    # with a certified bound of 0.05 at k = 1: position 1 (+0.3) is improved for sure, position 4
    # (0.0) possibly, position 2 (-0.1) never
    bound = np.array([[0.0, 0.05, 0.1, 0.1]] * 4)
    b = ea.summarise(probs, bound)
    assert b["tv_change_1_0_bound"] == pytest.approx(0.05)
    assert (b["frac_improved_certain"], b["frac_improved_possible"]) == (0.5, 0.75)


def test_the_change_interval_is_paired_by_position():
    """The paired interval of a difference uses the pairing."""
    rng = np.random.default_rng(5)
    # p_1 = p_0 + 0.01 at every position: the change is exactly -0.01 with a zero-width interval,
    # although each eps_k on its own has a wide one
    p0 = rng.random(500)
    s = ea.summarise(np.stack([p0, p0 + 0.01], axis=1))
    assert s["tv_change_1_0_ci"] == pytest.approx([-0.01, -0.01])
    assert s["tv_ci_by_iters"]["0"][1] - s["tv_ci_by_iters"]["0"][0] > 0.03
    assert s["tv_change_1_0_verdict"].endswith("RPT (k = 1) lowers the error")
    # a change well inside the noise is not called an improvement
    noisy = ea.summarise(np.stack([p0, np.clip(p0 + rng.normal(0, 0.05, 500) + 0.0005, 0, 1)], axis=1))
    assert noisy["tv_change_1_0_verdict"].endswith("not distinguishable from no change")
    # nor one inside the estimator's bound
    bounded = ea.summarise(np.stack([p0, p0 + 0.01], axis=1), np.array([[0.0, 0.02]] * 500))
    assert bounded["tv_change_1_0_verdict"].endswith("not distinguishable from no change")


# ---- (4) the script end to end ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny RPT checkpoint with a byte-level BPE tokenizer trained here, and a text file."""
    from rpt.data import train_bpe_tokenizer

    root = tmp_path_factory.mktemp("error_analysis")
    text = "".join(Path(m.__file__).read_text() for m in (json, importlib.util))[:20000]
    tokenizer = train_bpe_tokenizer([text], vocab_size=300)
    assert tokenizer.eos_token_id is not None
    model = random_rpt(len(tokenizer), seed=3)
    ckpt = root / "ckpt"
    model.save_pretrained(ckpt)
    tokenizer.save_pretrained(ckpt)
    text_file = root / "valid.txt"
    text_file.write_text(text[:3000])
    return ckpt, text_file


def test_script_end_to_end(checkpoint, tmp_path, capsys):
    ckpt, text_file = checkpoint
    script = load_script("eval/error_analysis.py")
    out = tmp_path / "ea.json"
    args = ["--checkpoint", str(ckpt), "--text-file", str(text_file), "--limit", "10", "--top-m", "8",
            "--batch-size", "4", "--out", str(out)]
    assert script.main(args) == 0
    printed = capsys.readouterr().out
    assert "estimator: top-m (m = 8" in printed and str(out) in printed
    summary = json.loads(out.read_text())
    assert {"tv_by_iters", "frac_improved", "n_positions", "estimator", "histogram", "coverage",
            "tv_error_bound_by_iters"} <= summary.keys()
    assert set(summary["tv_by_iters"]) == {"0", "1", "2", "3"}
    assert summary["n_positions"] == 10 and sum(summary["histogram"]["counts"]) == 10
    assert summary["estimator"] == {"name": "top-m", "m": 8}
    assert all(0.0 <= v <= 1.0 for v in summary["tv_by_iters"].values())
    assert out.with_suffix(".md").read_text().startswith("# RPT error analysis")
    md = out.with_suffix(".md").read_text()
    assert "95% CI (bootstrap)" in md and "eps_1 - eps_0" in md and summary["tv_change_1_0_verdict"] in md
    lo, hi = summary["tv_change_1_0_ci"]
    assert lo <= summary["tv_change_1_0"] <= hi and summary["tv_change_1_0_bound"] >= 0
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert len(out.with_name("ea.items.jsonl").read_text().splitlines()) == 10
    # A rerun on the same output resumes: nothing recomputed, same numbers.
    assert script.main(args) == 0
    assert len(out.with_name("ea.items.jsonl").read_text().splitlines()) == 10
    assert json.loads(out.read_text())["tv_by_iters"] == summary["tv_by_iters"]


def test_script_exact_matches_the_library_on_the_same_positions(checkpoint, tmp_path):
    ckpt, text_file = checkpoint
    script = load_script("eval/error_analysis.py")
    out = tmp_path / "exact.json"
    args = ["--checkpoint", str(ckpt), "--text-file", str(text_file), "--limit", "4", "--exact", "--context-len", "24",
            "--seed", "5", "--out", str(out)]
    assert script.main(args) == 0
    summary = json.loads(out.read_text())
    assert summary["estimator"] == {"name": "exact"} and "tv_error_bound_by_iters" not in summary
    # Rebuild the positions as documented: EOS + tokens, t >= 20, at most 24 tokens of context.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    doc = [tokenizer.eos_token_id] + tokenizer(text_file.read_text(), add_special_tokens=False)["input_ids"]
    model = RPTForCausalLM.from_pretrained(ckpt).eval()
    picked = ea.sample_positions([len(doc)], 20, 4, 5)
    contexts, truths = [doc[max(0, t - 24):t] for _, t in picked], [doc[t] for _, t in picked]
    assert min(map(len, contexts)) >= 20 and max(map(len, contexts)) == 24
    want = 1 - ea.truth_probabilities(model, contexts, truths, iters=ITERS).probs.mean(0).numpy()
    np.testing.assert_allclose([summary["tv_by_iters"][str(k)] for k in range(4)], want, rtol=1e-5, atol=1e-7)
    # The sampler's rule (greedy PTP above a confidence): its own results, not the stored sampled ones.
    greedy = tmp_path / "greedy.json"
    assert script.main(args[:-1] + [str(greedy), "--ptp", "greedy", "--confidence", "0.2"]) == 0
    summary = json.loads(greedy.read_text())
    assert summary["ptp"] == {"greedy": True, "confidence": 0.2, "label": "greedy PTP, confidence 0.2"}
    rule = ea.PTPRule(greedy=True, confidence=0.2)
    want = 1 - ea.truth_probabilities(model, contexts, truths, iters=ITERS, rule=rule).probs.mean(0).numpy()
    np.testing.assert_allclose([summary["tv_by_iters"][str(k)] for k in range(4)], want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("bad", [
    ["--confidence", "1.5"],
    ["--checkpoint", "{tmp}/missing"],
    ["--min-context", "30", "--context-len", "20"],
    ["--text-file", "{tmp}/missing.txt"],
    ["--text-file", "{tmp}/short.txt"],
    ["--data", "{tmp}/bad.jsonl"],
    ["--limit", "x"],
])
def test_script_bad_input_is_one_error_line(checkpoint, tmp_path, capsys, bad):
    ckpt, text_file = checkpoint
    (tmp_path / "short.txt").write_text("x = 1\n")
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"txt": 1}\n')
    script = load_script("eval/error_analysis.py")
    args = ["--checkpoint", str(ckpt), "--text-file", str(text_file), "--out", str(tmp_path / "o.json")]
    bad = [b.format(tmp=tmp_path) for b in bad]
    if "--data" in bad or "--text-file" in bad:
        args = args[:2] + args[4:]
    try:
        rc = script.main(args + bad)
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert not (tmp_path / "o.json").exists()


# ---- proper scores, acceptance and the precondition ------------------------------------------------
@torch.no_grad()
def _naive_tables(model, context):
    vocab = model.config.vocab_size
    c = len(context)

    def last(tokens, **kw):
        return torch.softmax(model(torch.tensor([tokens]), **kw).logits[0, -1].double(), dim=-1)

    ptp = {"position_ids": torch.tensor([list(range(c)) + [c + 1]]), "offset_ids": torch.tensor([[0] * c + [1]]),
           "use_cache": False}
    return (last(context), torch.stack([last(context + [a]) for a in range(vocab)]),
            torch.stack([last(context + [b], **ptp) for b in range(vocab)]))


@pytest.mark.parametrize("greedy", [False, True])
def test_brier_and_acceptance_against_naive_calls(model, positions, greedy):
    contexts, truths = positions[0][:2], positions[1][:2]
    rule = ea.PTPRule(greedy=greedy)
    got = ea.truth_probabilities(model, contexts, truths, iters=2, rule=rule)
    full = ea.truth_probabilities(model, contexts, truths, iters=2, top_m=VOCAB, rule=rule)
    for j, c in enumerate(contexts):
        p0, n, p = _naive_tables(model, c)
        m0 = p0 @ n
        marg = [p0, (m0 @ p) if not greedy else None]
        if not greedy:
            assert float(got.sq[j, 1]) == pytest.approx(float((marg[1] ** 2).sum()), rel=1e-4)
        assert float(got.sq[j, 0]) == pytest.approx(float((p0 ** 2).sum()), rel=1e-4)
        for e, eta in enumerate(ea.ETAS):  # a loop over x_{i+1}: accepted moves of the PTP step
            want = sum(float(m0[b]) * (float(p[b].max() > eta) if greedy else float(p[b][p[b] > eta].sum()))
                       for b in range(VOCAB))
            assert float(got.accept[j, e]) == pytest.approx(want, rel=1e-4, abs=1e-6)
    torch.testing.assert_close(full.sq, got.sq, rtol=1e-5, atol=1e-7)  # top-m at m = V: the same numbers
    torch.testing.assert_close(full.accept, got.accept, rtol=1e-5, atol=1e-7)


def test_proper_scores_summary_by_hand():
    probs = np.array([[0.5, 0.25], [1.0, 0.5]])
    sq = np.array([[0.5, 0.25], [1.0, 0.5]])
    s = ea.proper_scores(probs, sq, np.array([[1.0, 0.5, 0.2, 0.0], [1.0, 0.7, 0.4, 0.2]]))
    assert s["log_score_by_iters"]["0"] == pytest.approx(np.log(2) / 2)
    assert s["brier_by_iters"]["0"] == pytest.approx(((0.5 - 1.0 + 1.0) + (1.0 - 2.0 + 1.0)) / 2)
    assert s["acceptance_by_eta"] == pytest.approx({"0.0": 1.0, "0.5": 0.6, "0.7": 0.3, "0.9": 0.1})


def test_ptp_vs_implied_against_naive_calls(model, positions):
    contexts = positions[0][:2]
    cur, nxt = [3, 7], [5, 1]
    got = ea.ptp_vs_implied(model, contexts, cur, nxt)
    for j, c in enumerate(contexts):
        p0, n, p = _naive_tables(model, c)
        joint = p0 * n[:, nxt[j]]
        assert float(got[j, 1]) == pytest.approx(-np.log(float(joint[cur[j]] / joint.sum())), rel=1e-4)
        assert float(got[j, 0]) == pytest.approx(-np.log(float(p[nxt[j], cur[j]])), rel=1e-4)


def test_script_writes_proper_scores_and_the_precondition(checkpoint, tmp_path):
    ckpt, text_file = checkpoint
    script = load_script("eval/error_analysis.py")
    out = tmp_path / "ea.json"
    assert script.main(["--checkpoint", str(ckpt), "--text-file", str(text_file), "--limit", "6", "--top-m", "8",
                        "--ptp", "greedy", "--confidence", "0.5", "--precondition", "3", "--out", str(out)]) == 0
    s = json.loads(out.read_text())
    assert set(s["log_score_by_iters"]) == set(s["brier_by_iters"]) == set(s["tv_by_iters"])
    assert set(s["acceptance_by_eta"]) == {"0.0", "0.5", "0.7", "0.9"}
    acc = [s["acceptance_by_eta"][k] for k in ("0.0", "0.5", "0.7", "0.9")]
    assert acc == sorted(acc, reverse=True)  # a higher threshold accepts less
    pc = s["precondition"]
    assert pc["n_positions"] == 3 and pc["difference"] == pytest.approx(pc["ptp_head_loss"] - pc["ntp_implied_loss"])
    md = out.with_suffix(".md").read_text()
    assert "Brier score" in md and "NTP-implied" in md
