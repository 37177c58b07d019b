"""The sampler's chain at temperature > 0 against an exact enumeration of the paper's eq. 4 / eq. 6.

A 3-token model, so every conditional the chain uses can be computed with a plain, uncached forward
(nothing of the decoder's code: no cache, no mask, no proposal rules) and the law of the first new
tokens enumerated exactly. Setting: temperature 1, ``k = 1``, confidence 0 (every PTP proposal is
accepted), greedy or sampled PTP. 3000 rows of one prompt, each with its own row seed (a hash of ``(seed, b)``), are
3000 independent draws of the chain; their empirical joint must be within 0.04 in total variation of
the exact one (the expected TV of 3000 draws of a 9-cell law is about 0.02).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from rpt.model import RPTForCausalLM
from rpt.sampling import SamplingConfig, generate
from tests.helpers.tiny_models import tiny_llama

V = 3
PROMPT = [0, 1, 2, 1]
DRAWS = 3000
TOLERANCE = 0.04


@pytest.fixture(scope="module")
def model() -> RPTForCausalLM:
    # seed 1 / init 0.3: spread-out conditionals (no token above 0.8), an NTP next-token law that
    # depends on x_i and a PTP-1 argmax that differs for each x_{i+1}: eq. 4 differs from NTP here
    m = RPTForCausalLM.from_base(tiny_llama(vocab_size=V, seed=1, initializer_range=0.3), window=3).double().eval()
    m.lm.generation_config.eos_token_id = None  # LlamaConfig's default EOS (2) is a token of this 3-token chain
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        m.offset_embedding.weight.copy_(torch.randn(m.offset_embedding.weight.shape, generator=g, dtype=torch.float64))
    return m


class Conditionals:
    """``p(x_c | x_<c)`` and ``p(x_j | x_<j, x_{j+1..t})`` by plain uncached forwards (eq. 8)."""

    def __init__(self, model):
        self.model, self.memo = model, {}

    def _last(self, ids, positions, rows) -> tuple[float, ...]:
        key = (tuple(ids), tuple(positions), tuple(rows))
        if key not in self.memo:
            with torch.no_grad():
                out = self.model(torch.tensor([ids]), position_ids=torch.tensor([positions]),
                                 offset_ids=torch.tensor([rows]), use_cache=False)
            self.memo[key] = tuple(torch.softmax(out.logits[0, -1], -1).tolist())
        return self.memo[key]

    def ntp(self, prefix: list[int]) -> tuple[float, ...]:
        return self._last(prefix, list(range(len(prefix))), [0] * len(prefix))

    def ptp(self, before: list[int], after: list[int]) -> tuple[float, ...]:
        j = len(before)
        return self._last(before + after, list(range(j)) + list(range(j + 1, j + 1 + len(after))),
                          [0] * j + list(range(1, len(after) + 1)))


def resample(law: dict, index: int, conditional) -> dict:
    """The law after replacing coordinate ``index`` of the state by a draw from ``conditional(state)``."""
    out: dict = {}
    for state, p in law.items():
        for v, q in enumerate(conditional(state)):
            if q > 0:
                new = state[:index] + (v,) + state[index + 1:]
                out[new] = out.get(new, 0.0) + p * q
    return out


def exact_joint(cond: Conditionals, window: int, new: int, greedy_ptp: bool) -> dict:
    """Eq. 4 (w = 2) / eq. 6 (w = 3) with k = 1 for the first ``new`` tokens, enumerated exactly."""

    def ptp(state, j, t):
        probs = cond.ptp(PROMPT + list(state[:j]), list(state[j + 1: t + 1]))
        if greedy_ptp:  # the argmax; confidence 0 accepts it
            best = max(range(V), key=probs.__getitem__)
            return tuple(float(v == best) for v in range(V))
        return probs

    law = {(): 1.0}
    for t in range(new):
        law = {s + (0,): p for s, p in law.items()}  # a placeholder for x_t, drawn next
        law = resample(law, t, lambda s, t=t: cond.ntp(PROMPT + list(s[:t])))  # NTP proposal of x_t
        lo = max(t - window + 1, 0)
        if lo < t:  # one iteration: a PTP sweep over the window, oldest first, then x_t again by NTP
            for j in range(lo, t):
                law = resample(law, j, lambda s, j=j, t=t: ptp(s, j, t))
            law = resample(law, t, lambda s, t=t: cond.ntp(PROMPT + list(s[:t])))
    return law


def ntp_joint(cond: Conditionals, new: int) -> dict:
    law = {(): 1.0}
    for t in range(new):
        law = {s + (0,): p for s, p in law.items()}
        law = resample(law, t, lambda s, t=t: cond.ntp(PROMPT + list(s[:t])))
    return law


def tv(p: dict, q: dict) -> float:
    return 0.5 * sum(abs(p.get(s, 0.0) - q.get(s, 0.0)) for s in set(p) | set(q))


def empirical(decode, model, window: int, new: int, greedy_ptp: bool, draws: int, seed: int) -> dict:
    cfg = SamplingConfig(max_new_tokens=new, temperature=1.0, rpt_iters=1, rpt_window=window, confidence=0.0,
                         ptp_greedy=greedy_ptp, seed=seed)
    out = decode(model, torch.tensor([PROMPT] * draws), cfg)
    counts: dict = {}
    for row in out.sequences[:, len(PROMPT):].tolist():
        counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    return {s: c / draws for s, c in counts.items()}


@pytest.mark.parametrize("window,new", [(2, 2), (3, 3)])
@pytest.mark.parametrize("greedy_ptp", [True, False], ids=["greedy-ptp", "sampled-ptp"])
def test_first_new_tokens_follow_eq4_exactly(model, window, new, greedy_ptp):
    cond = Conditionals(model)
    exact = exact_joint(cond, window, new, greedy_ptp)
    assert sum(exact.values()) == pytest.approx(1.0)
    # the test has power: eq. 4 moves the joint far from plain NTP sampling on this model
    assert tv(exact, ntp_joint(cond, new)) > 0.1
    # w = 3 has 27 cells: twice the draws keep the sampling noise (expected TV ~ 0.03) under 0.04
    draws = DRAWS * (1 if window == 2 else 2)
    got = empirical(generate, model, window, new, greedy_ptp, draws, seed=1234)
    assert tv(got, exact) < TOLERANCE, (tv(got, exact), got, exact)


def test_enumeration_itself_on_a_hand_computed_chain():
    """``resample`` on a two-token toy chain, against the closed form sum_a,b p0(a) N(b|a) P(a'|b) N(b'|a')."""
    p0, N, P = (0.3, 0.7), ((0.9, 0.1), (0.2, 0.8)), ((0.6, 0.4), (0.1, 0.9))
    law = resample({(0, 0): 1.0}, 0, lambda s: p0)
    law = resample(law, 1, lambda s: N[s[0]])
    law = resample(law, 0, lambda s: P[s[1]])
    law = resample(law, 1, lambda s: N[s[0]])
    for a2, b2 in itertools.product(range(2), range(2)):
        want = sum(p0[a] * N[a][b] * P[b][a2] * N[a2][b2] for a in range(2) for b in range(2))
        assert law[(a2, b2)] == pytest.approx(want)
