"""The RPT paper's error analysis (Sec. 5.3, Table 2 and Fig. 6), window w = 2.

At a validation position ``i`` with ground-truth context ``x_<i`` (at least 20 tokens) write

* ``p0(a)     = p_NTP(x_i = a | x_<i)``                 -- the NTP marginal of ``x_i``,
* ``N(b | a)  = p_NTP(x_{i+1} = b | x_<i, x_i = a)``     -- NTP of the next token,
* ``P(a' | b) = p_PTP-1(x_i = a' | x_<i, x_{i+1} = b)``  -- PTP-1, the previous-token conditional.

RPT (eq. 4) starts from NTP (``x_i ~ p0``, ``x_{i+1} ~ N(.|x_i)``) and each iteration resamples
``x_i ~ P(.|x_{i+1})`` then ``x_{i+1} ~ N(.|x_i)``. The joint after an iteration only depends on
the previous ``x_{i+1}``, so the marginal ``p_k`` of ``x_i`` after ``k`` iterations obeys

    m_k = p_k N        (row vector times matrix: the law of x_{i+1}),
    p_{k+1} = m_k P,

and the paper's error is ``eps_k = 1 - p_k(x_i)`` at the true ``x_i``, averaged over positions
(Table 2, ``k = 0`` is NTP).

**The sampler's PTP rule** (:class:`PTPRule`). The paper's main results use *greedy* PTP with a
*confidence* threshold eta (Sec. 5.1, "Practical sampling"; the sampler's defaults): the PTP step
proposes ``a' = argmax P(.|b)`` (or draws ``a' ~ P(.|b)``) and keeps the old ``x_i`` unless
``P(a'|b) > eta``. Write ``K(b, a') = R(a'|b) [P(a'|b) > eta]`` for the accepted moves (``R`` the
proposal law) and ``r(b) = 1 - sum_a' K(b, a')`` for the chance of keeping ``x_i``. As ``x_{i+1}``
is always redrawn from ``N`` after the PTP step, the joint after an iteration is still
``p_k(a) N(b|a)``, and

    p_{k+1} = (p_k N) K + p_k * (N r)          (``*`` elementwise; ``N r`` = keep-chance of each a).

Sampled PTP with ``eta = 0`` gives ``K = P``, ``r = 0``: the plain chain above. Fig. 6 is the histogram of ``p_1(x_i) - p_0(x_i)``. This is the
chain the sampler runs (:mod:`rpt.sampling.algorithm`; ``tests/properties/test_eq4_distribution.py`` checks
the sampler's draws against its exact enumeration).

**Exact** (small vocabularies): ``N`` needs one NTP query per ``a`` (token ``a`` at position
``i``, offset row 0) and ``P`` one PTP-1 query per ``b`` (token ``b`` at position ``i + 1``,
offset row 1 = ``tau - sigma = -1``, seeing only ``x_<i``). All queries of a position run over
one forward of its context: the context fills a position-addressed KV cache, then many query
tokens go in a single call (:class:`rpt.decode_forward.queries.ModelQueries`, which owns the mask and checks the
attention implementation), written to scratch columns after the context, each seeing the context
and itself only. Positions are batched with left padding.

**Top-m estimator** (large vocabularies): propagate the marginal itself, truncated. With
``q_0 = p0`` (exact, over the whole vocabulary) each iteration

1. keeps the top ``m`` tokens ``A_k`` of ``q_k`` and renormalises (``q~_k``),
2. queries ``N(.|a)`` for ``a in A_k`` and forms ``m_k = q~_k N`` over the whole vocabulary,
3. keeps the top ``m`` tokens ``B_k`` of ``m_k`` and renormalises (``m~_k``),
4. queries ``P(.|b)`` for ``b in B_k`` and forms ``q_{k+1} = m~_k P``, again over the whole
   vocabulary,

and reports ``q_k(x_i)``. Under a rule with a confidence threshold (which can keep ``x_i``) the
estimator does not renormalise: the pairs ``(a, b)`` it did not explore keep ``x_i``, so
``q_{k+1} = sum_{b in B_k} f(b) K(b, .) + [kept x_i]`` with ``f(b) = sum_{a in A_k} q_k(a) N(b|a)``;
renormalising over-weights the frequent ``x_{i+1}``, whose PTP rows pass the threshold more often
(on the demo's model, greedy PTP at eta = 0.9: eps_1 0.777 at m = 16 and 0.799 at m = 256 against
0.808 exact on 64 positions; kept: 0.8084 at m = 16). The first iteration is the plain truncation of both tokens (``x_i`` to
the top ``m`` of ``p0``, ``x_{i+1}`` to the top ``m`` of the induced next-token marginal), except
that the ``P`` rows are kept whole; later iterations re-choose the supports. A single fixed
``A x B`` with renormalised ``P`` rows was tried first and is biased badly when the PTP head puts
mass outside the top of ``p0`` -- exactly RPT's corrections (0.1-0.2 in ``eps_k`` on a random
model). Cost: ``2 m`` queries per iteration and position. With ``m = V`` it is exact.

Bias and a certified bound: renormalising a distribution onto a set moves it by exactly the
dropped mass in total variation (``TV(q~, q) = 1 - q(A)``), and the Markov kernels ``N`` and
``P`` never increase TV, so ``TV(q_k, p_k) <= E_k`` with ``E_0 = 0`` and
``E_{k+1} = E_k + (1 - q_k(A_k)) + (1 - m_k(B_k))``. Hence ``|q_k(x_i) - p_k(x_i)| <= E_k``
at every position, and the mean ``eps_k`` is within the mean ``E_k`` of the exact one. The bound
is a worst case and loose (with a threshold rule ``E_{k+1} = E_k + 1 - q_k(A_k) m_k(B_k)``, the mass of the
unexplored pairs); the actual error is far smaller (tests: about 0.01 at ``m = V / 3``;
a briefly trained 4096-token model: mean ``eps_k`` within 0.002 of exact at ``m = 16``; the demo's
model, 64 positions: within 0.005 at ``k = 1``).
The sign of the error is not fixed: renormalising inflates the kept tokens' continuations and
loses the dropped ones', so ``q_k(x_i)`` is too high when the truth is mostly reached through
kept tokens and too low otherwise.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, SymmetricalLogLocator

from rpt.decode_forward.queries import ModelQueries, Visibility
from rpt.statistics import LEVEL, bootstrap_ci

NTP_ROW, PTP1_ROW = 0, 1
HISTOGRAM_BINS = 50
ETAS = (0.0, 0.5, 0.7, 0.9)  # the confidences whose acceptance rate is reported beside Table 2


# ---- the chain ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class PTPRule:
    """How the PTP step moves ``x_i``: ``greedy`` (argmax) or sampled, accepted only when the
    proposal's PTP probability exceeds ``confidence`` (the sampler's ``SamplingConfig`` knobs)."""

    greedy: bool = False
    confidence: float = 0.0

    @property
    def label(self) -> str:
        return f"{'greedy' if self.greedy else 'sampled'} PTP, confidence {self.confidence:g}"

    def kernel(self, prev_cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(K, r)`` from PTP rows ``prev_cond[..., b, a] = P(a|b)``: ``K[..., b, a']`` the
        chance the step moves ``x_i`` to ``a'``, ``r[..., b]`` the chance it keeps ``x_i``."""
        if self.greedy:
            top = prev_cond.argmax(dim=-1, keepdim=True)  # first maximum, as the sampler's argmax
            proposal = torch.zeros_like(prev_cond).scatter_(-1, top, 1.0)
        else:
            proposal = prev_cond
        moves = proposal * (prev_cond > self.confidence)
        return moves, (1.0 - moves.sum(dim=-1)).clamp(min=0.0)


SAMPLED_PTP = PTPRule()  # eq. 4 as written


def chain_marginals(p0: torch.Tensor, next_cond: torch.Tensor, prev_cond: torch.Tensor, iters: int,
                    rule: PTPRule = SAMPLED_PTP) -> torch.Tensor:
    """Marginals ``p_0 .. p_iters`` of ``x_i`` under the w = 2 RPT chain.

    ``p0``: ``[..., A]``; ``next_cond[..., a, b] = N(b|a)``: ``[..., A, B]``;
    ``prev_cond[..., b, a] = P(a|b)``: ``[..., B, A]``. Returns ``[..., iters + 1, A]`` with
    ``p_{k+1} = (p_k N) K + p_k * (N r)`` (``K = P``, ``r = 0`` for sampled PTP without a threshold).
    """
    moves, keep = rule.kernel(prev_cond)
    stay = (next_cond @ keep.unsqueeze(-1)).squeeze(-1)  # [..., A]: chance the PTP step keeps a
    marginals = [p0]
    p = p0
    for _ in range(iters):
        p = ((p.unsqueeze(-2) @ next_cond) @ moves).squeeze(-2) + p * stay
        marginals.append(p)
    return torch.stack(marginals, dim=-2)


# ---- model queries -----------------------------------------------------------------------------
@dataclass
class EncodedContexts:
    """A batch of left-padded contexts in a position-addressed KV cache, and the NTP marginal after each.

    Cache columns ``0 .. width-1`` hold the contexts (row j's from ``start[j]``); queries are written in
    the scratch columns after them, so each call sees the contexts untouched.
    """

    queries: ModelQueries  # the model on its cache (rpt.decode_forward.queries: the mask format, the attention check)
    width: int  # padded context width
    start: torch.Tensor  # [B] first real column per row
    lengths: torch.Tensor  # [B] context lengths
    p0: torch.Tensor  # [B, V] float64


@torch.no_grad()
def encode_contexts(model, contexts: Sequence[Sequence[int]], pad_id: int = 0, query_chunk: int = 512) -> EncodedContexts:
    """One forward of every context (left-padded to the longest), filling a fresh KV cache with room
    for ``query_chunk`` queries per call after it."""
    device = next(model.parameters()).device
    lengths = torch.tensor([len(c) for c in contexts], device=device)
    width = int(lengths.max())
    ids = torch.full((len(contexts), width), pad_id, dtype=torch.long, device=device)
    for row, context in enumerate(contexts):
        ids[row, width - len(context):] = torch.as_tensor(list(context), dtype=torch.long, device=device)
    col = torch.arange(width, device=device)
    start = width - lengths
    # real tokens at positions 0..len-1; each sees the real columns up to its own (padding only itself)
    position_ids = (col[None, :] - start[:, None]).clamp(min=0)
    queries = ModelQueries(model, width + query_chunk)
    logits = queries(ids, position_ids, col, Visibility(col, start), kv_len=width, keep=1)[:, -1]
    return EncodedContexts(queries, width, start, lengths, torch.softmax(logits.double(), dim=-1))


@torch.no_grad()
def query_tokens(model, enc: EncodedContexts, tokens: torch.Tensor, shift: int, row: int, chunk: int = 512) -> torch.Tensor:
    """Full distributions ``[B, Q, V]`` (float64) at query tokens placed after the cached contexts.

    Query ``tokens[j, q]`` sits at position ``lengths[j] + shift`` with offset row ``row`` and
    sees its context and itself only: ``shift=0, row=0`` gives ``N(.|a)`` for ``a = tokens``,
    ``shift=1, row=1`` gives ``P(.|b)`` (PTP-1: ``x_{i+1} = b`` predicting ``x_i``). Queries go in
    calls of at most ``chunk`` per row, written to scratch columns after the contexts.
    """
    batch, total = tokens.shape
    width = enc.width
    chunk = max(1, min(chunk, enc.queries.capacity - width))
    limit = torch.full((1,), width - 1, device=tokens.device)
    out = []
    for lo in range(0, total, chunk):
        part = tokens[:, lo:lo + chunk]
        q = part.shape[1]
        columns = width + torch.arange(q, device=part.device)
        position_ids = (enc.lengths + shift)[:, None].expand(batch, q)
        logits = enc.queries(part, position_ids, columns, Visibility(limit.expand(q), enc.start), kv_len=width + q,
                             offsets=torch.full_like(part, row) if row else None)
        out.append(torch.softmax(logits.double(), dim=-1))
    return torch.cat(out, dim=1)


# ---- per-position probabilities ------------------------------------------------------------------
@dataclass
class PositionResult:
    """``probs[j, k]``: ``p_k(x_i)`` at the true token (exact, or the top-m estimate ``q_k``),
    ``bound[j, k]``: the certified ``|q_k(x_i) - p_k(x_i)| <= E_k`` (0 when exact), and
    ``coverage[j]``: the kept masses ``q_k(A_k)`` and ``m_k(B_k)``, averaged over iterations."""

    probs: torch.Tensor  # [B, iters + 1] float64
    bound: torch.Tensor  # [B, iters + 1]
    coverage: torch.Tensor  # [B, 2]
    sq: torch.Tensor | None = None  # [B, iters + 1]: sum_a p_k(a)^2 (the Brier score's other term)
    accept: torch.Tensor | None = None  # [B, len(ETAS)]: chance the first PTP step moves x_i, per eta


def _truncate(dist: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top ``m`` support of each row, its renormalised probabilities and the kept mass."""
    kept, support = dist.topk(m, dim=1)
    mass = kept.sum(dim=1)
    return support, kept / mass[:, None], mass


@torch.no_grad()
def truth_probabilities(
    model, contexts: Sequence[Sequence[int]], truths: Sequence[int], iters: int = 3, top_m: int | None = None,
    chunk: int = 512, pad_id: int = 0, rule: PTPRule = SAMPLED_PTP,
) -> PositionResult:
    """``p_k(x_i)`` for a batch of positions: exact (``top_m=None``) or the top-m estimator."""
    enc = encode_contexts(model, contexts, pad_id)
    p0 = enc.p0
    batch, vocab = p0.shape
    truth = torch.as_tensor(list(truths), dtype=torch.long, device=p0.device)[:, None]
    zeros = torch.zeros(batch, iters + 1, dtype=p0.dtype, device=p0.device)
    if top_m is None:
        support = torch.arange(vocab, device=p0.device).expand(batch, vocab)
        next_cond = query_tokens(model, enc, support, shift=0, row=NTP_ROW, chunk=chunk)
        prev_cond = query_tokens(model, enc, support, shift=1, row=PTP1_ROW, chunk=chunk)
        marginals = chain_marginals(p0, next_cond, prev_cond, iters, rule)
        probs = marginals.gather(2, truth[:, :, None].expand(batch, iters + 1, 1)).squeeze(2)
        following = (p0.unsqueeze(-2) @ next_cond).squeeze(-2)  # [B, V]: law of x_{i+1} under NTP
        return PositionResult(probs, zeros, torch.ones(batch, 2, dtype=p0.dtype, device=p0.device),
                              marginals.pow(2).sum(dim=-1), acceptance(following, prev_cond, rule.greedy))

    m = min(int(top_m), vocab)
    q, probs, bound, masses = p0, [p0.gather(1, truth)], zeros.clone(), []
    sq, accept = [p0.pow(2).sum(dim=1)], None
    for k in range(iters):
        a_set, q_a, mass_a = _truncate(q, m)
        next_rows = query_tokens(model, enc, a_set, 0, NTP_ROW, chunk)  # [B, m, V]: N(.|a), a in A_k
        following = torch.einsum("ja,jav->jv", q_a, next_rows)
        b_set, m_b, mass_b = _truncate(following, m)
        prev_rows = query_tokens(model, enc, b_set, 1, PTP1_ROW, chunk)
        moves, keep = rule.kernel(prev_rows)
        if k == 0:  # the first step's acceptance, over the kept x_{i+1} (renormalised: an estimate)
            accept = acceptance(m_b, prev_rows, rule.greedy)
        next_in_b = next_rows.gather(2, b_set[:, None, :].expand(-1, m, -1))  # [B, m_a, m_b]: N(b|a)
        if rule.confidence > 0:
            # A rule that can keep x_i: the pairs (a, b) left unexplored keep it too (no
            # renormalisation). Renormalising onto the explored pairs over-weights the frequent
            # x_{i+1}, whose PTP rows pass the threshold more often: on the demo's model it moved
            # eps_1 by 0.03 against the exact chain even at m = 256.
            explored = q_a * mass_a[:, None]  # q(a) for a in A_k
            q_next = torch.einsum("jb,jbv->jv", following[:, None, :].gather(2, b_set[:, None, :])[:, 0] * mass_a[:, None],
                                  moves)
            kept = explored * ((next_in_b @ keep.unsqueeze(-1)).squeeze(-1) + 1.0 - next_in_b.sum(dim=2))
            q = q_next.scatter_add(1, a_set, kept) + q.scatter(1, a_set, 0.0)  # a outside A_k: kept as they were
            unexplored = 1.0 - mass_a * mass_b  # the pairs whose move was not computed
        else:
            q = torch.einsum("jb,jbv->jv", m_b, moves)
            # The kept x_i: a in A_k with the truncated joint q~(a) N(b|a) / m_k(B_k) over b in B_k.
            stay = (next_in_b @ keep.unsqueeze(-1)).squeeze(-1) / mass_b[:, None]
            q = q.scatter_add(1, a_set, q_a * stay)
            unexplored = (1.0 - mass_a) + (1.0 - mass_b)
        probs.append(q.gather(1, truth))
        sq.append(q.pow(2).sum(dim=1))
        bound[:, k + 1] = bound[:, k] + unexplored
        masses.append(torch.stack([mass_a, mass_b], dim=1))
    coverage = torch.stack(masses).mean(dim=0)
    return PositionResult(torch.cat(probs, dim=1), bound.clamp(0.0, 1.0), coverage, torch.stack(sq, dim=1), accept)


def acceptance(following: torch.Tensor, prev_rows: torch.Tensor, greedy: bool, etas: Sequence[float] = ETAS) -> torch.Tensor:
    """``[B, len(etas)]``: the chance the PTP step moves ``x_i`` (its proposal's probability above
    eta) when ``x_{i+1} ~ following[B, b]``, ``prev_rows[B, b, a] = P(a|b)``."""
    return torch.stack([(following * PTPRule(greedy, eta).kernel(prev_rows)[0].sum(dim=-1)).sum(dim=-1)
                        for eta in etas], dim=1)


@torch.no_grad()
def ptp_vs_implied(model, contexts: Sequence[Sequence[int]], current: Sequence[int], following: Sequence[int],
                   pad_id: int = 0, chunk: int = 512) -> torch.Tensor:
    """``[B, 2]``: the PTP-1 loss ``-log P(x_i | x_<i, x_{i+1})`` of the PTP head and of the PTP the NTP
    head implies, ``P*(a | b) ∝ p0(a) N(b | a)``, at the true ``(x_i, x_{i+1})`` -- exact: ``V``
    NTP queries per position."""
    enc = encode_contexts(model, contexts, pad_id)
    batch, vocab = enc.p0.shape
    a = torch.as_tensor(list(current), dtype=torch.long, device=enc.p0.device)
    b = torch.as_tensor(list(following), dtype=torch.long, device=enc.p0.device)
    support = torch.arange(vocab, device=a.device).expand(batch, vocab)
    n_to_b = query_tokens(model, enc, support, 0, NTP_ROW, chunk).gather(2, b[:, None, None].expand(-1, vocab, 1))[..., 0]
    joint = enc.p0 * n_to_b  # [B, a]: p0(a) N(b|a) at the true b
    implied = joint.gather(1, a[:, None])[:, 0] / joint.sum(dim=1)
    head = query_tokens(model, enc, b[:, None], 1, PTP1_ROW, chunk)[:, 0].gather(1, a[:, None])[:, 0]
    return -torch.log(torch.stack([head, implied], dim=1).clamp(min=1e-300))


# ---- positions -------------------------------------------------------------------------------------
def sample_positions(doc_lengths: Sequence[int], min_context: int, limit: int | None, seed: int) -> list[tuple[int, int]]:
    """``(doc, t)`` pairs, sorted: target token ``t`` of document ``doc`` with ``t >= min_context``.

    Drawn uniformly without replacement over all candidate positions with a seeded generator,
    so the same data, limit and seed give the same positions.
    """
    counts = np.array([max(0, n - min_context) for n in doc_lengths], dtype=np.int64)
    total = int(counts.sum())
    flat = np.arange(total) if limit is None or limit >= total else np.sort(
        np.random.default_rng(seed).choice(total, size=limit, replace=False))
    ends = np.cumsum(counts)
    docs = np.searchsorted(ends, flat, side="right")
    starts = ends - counts
    return [(int(d), int(min_context + f - starts[d])) for d, f in zip(docs, flat)]


# ---- summary and plot ------------------------------------------------------------------------------
BOOTSTRAP_SAMPLES = 2000  # resamples of every interval over positions (rpt.statistics.bootstrap_ci)


def proper_scores(probs: np.ndarray, sq: np.ndarray | None, accept: np.ndarray | None, seed: int = 0) -> dict:
    """Beside Table 2's ``1 - p_k(x_i)`` (improper: a one-hot argmax minimises its expectation), the
    proper log score ``-log p_k(x_i)`` and Brier score ``sum_a p_k(a)^2 - 2 p_k(x_i) + 1`` per k with
    95% bootstrap intervals, and the mean acceptance rate of the first PTP step per eta."""
    out: dict = {}
    if not len(probs):
        return out
    log = -np.log(np.clip(probs, 1e-300, None))
    out["log_score_by_iters"] = {str(k): float(log[:, k].mean()) for k in range(probs.shape[1])}
    out["log_score_ci_by_iters"] = {str(k): bootstrap_ci(log[:, k], BOOTSTRAP_SAMPLES, seed) for k in range(probs.shape[1])}
    if sq is not None:
        brier = np.asarray(sq, dtype=np.float64) - 2.0 * probs + 1.0
        out["brier_by_iters"] = {str(k): float(brier[:, k].mean()) for k in range(probs.shape[1])}
        out["brier_ci_by_iters"] = {str(k): bootstrap_ci(brier[:, k], BOOTSTRAP_SAMPLES, seed) for k in range(probs.shape[1])}
    if accept is not None:
        out["acceptance_by_eta"] = {str(eta): float(v) for eta, v in zip(ETAS, np.asarray(accept).mean(axis=0))}
    return out


def summarise(probs: np.ndarray, bound: np.ndarray | None = None, coverage: np.ndarray | None = None,
              seed: int = 0, sq: np.ndarray | None = None, accept: np.ndarray | None = None) -> dict:
    """Table 2 and Fig. 6 numbers from ``probs[n, k] = p_k(x_i)``, with their error bars.

    * ``tv_by_iters[k]``: mean of ``eps_k = 1 - p_k(x_i)``; ``tv_ci_by_iters[k]``: its 95%
      bootstrap interval over positions (``tv_sem_by_iters``: the standard error);
    * ``tv_change_1_0``: mean of ``eps_1 - eps_0`` (negative: RPT lowers the error), with its
      paired bootstrap interval ``tv_change_1_0_ci``;
    * ``frac_improved``: the fraction of positions with ``p_1 > p_0``, with
      ``frac_improved_ci``.

    p_0 and p_1 come from the same computation: exact, or the top-m estimator, whose k = 0 output
    is ``p_0`` itself (nothing is truncated before the first iteration). With the estimator
    (``bound``: its certified per-position ``E_k``), the error of each mean is at most the mean
    bound: ``tv_error_bound_by_iters[k]`` bounds ``|tv_by_iters[k] - exact|`` and, as
    ``E_0 = 0``, ``tv_change_1_0_bound`` bounds the change's; ``frac_improved_certain`` /
    ``frac_improved_possible`` count the positions where ``p_1 > p_0`` holds for every / some
    value within the bound. ``coverage`` gives the mean kept masses. ``tv_change_1_0_verdict``
    says in words whether the change is distinguishable from 0.
    """
    probs = np.asarray(probs, dtype=np.float64)
    n = len(probs)
    eps = 1.0 - probs
    summary = {
        "n_positions": n,
        "tv_by_iters": {str(k): float(eps[:, k].mean()) if n else float("nan") for k in range(probs.shape[1])},
        "tv_sem_by_iters": {str(k): float(eps[:, k].std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
                            for k in range(probs.shape[1])},
        "tv_ci_by_iters": {str(k): bootstrap_ci(eps[:, k], BOOTSTRAP_SAMPLES, seed) for k in range(probs.shape[1])},
        "bootstrap": {"samples": BOOTSTRAP_SAMPLES, "level": LEVEL, "over": "positions", "seed": seed},
    }
    summary.update(proper_scores(probs, sq, accept, seed))
    if bound is not None and n:
        bound = np.asarray(bound, dtype=np.float64)
        summary["tv_error_bound_by_iters"] = {str(k): float(v) for k, v in enumerate(bound.mean(axis=0))}
    if probs.shape[1] > 1:
        diff = probs[:, 1] - probs[:, 0]
        change = eps[:, 1] - eps[:, 0]
        improved = (diff > 0).astype(np.float64)
        summary["tv_change_1_0"] = float(change.mean()) if n else float("nan")
        summary["tv_change_1_0_ci"] = bootstrap_ci(change, BOOTSTRAP_SAMPLES, seed)
        summary["frac_improved"] = float(improved.mean()) if n else float("nan")
        summary["frac_improved_ci"] = bootstrap_ci(improved, BOOTSTRAP_SAMPLES, seed)
        if bound is not None and n:
            summary["tv_change_1_0_bound"] = float(bound[:, 1].mean())
            summary["frac_improved_certain"] = float((diff - bound[:, 1] > 0).mean())
            summary["frac_improved_possible"] = float((diff + bound[:, 1] > 0).mean())
        summary["tv_change_1_0_verdict"] = change_verdict(summary)
        lim = max(float(np.abs(diff).max()) if n else 0.0, 1e-6)
        counts, edges = np.histogram(diff, bins=HISTOGRAM_BINS, range=(-lim, lim))
        summary["histogram"] = {"of": "p_1 - p_0", "bin_edges": edges.tolist(), "counts": counts.tolist()}
    if coverage is not None and n:
        cov = np.asarray(coverage, dtype=np.float64).mean(axis=0)
        summary["coverage"] = {"x_i": float(cov[0]), "x_i+1": float(cov[1])}
    return summary


def change_verdict(summary: dict) -> str:
    """One sentence on ``eps_1 - eps_0``: lower / higher only when the whole bootstrap interval,
    widened by the estimator's bound, is on one side of 0."""
    change, (lo, hi) = summary["tv_change_1_0"], summary["tv_change_1_0_ci"]
    slack = summary.get("tv_change_1_0_bound", 0.0)
    text = f"eps_1 - eps_0 = {change:+.4f}, 95% CI [{lo:+.4f}, {hi:+.4f}]"
    if slack:
        text += f", estimator error <= {slack:.4f}"
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return text + ": too few positions to tell"
    if hi + slack < 0:
        return text + ": RPT (k = 1) lowers the error"
    if lo - slack > 0:
        return text + ": RPT (k = 1) raises the error"
    return text + ": not distinguishable from no change"


def plot_histogram(summary: dict, title: str) -> Figure:
    """Fig. 6: histogram of ``p_1(x_i) - p_0(x_i)`` with the fraction of positions improved."""
    hist = summary["histogram"]
    edges, counts = np.asarray(hist["bin_edges"]), np.asarray(hist["counts"])
    fig = Figure(figsize=(5.5, 3.5))
    ax = fig.add_subplot()
    ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge", color="tab:blue", alpha=0.8)
    ax.axvline(0.0, color="black", linestyle="--", linewidth=1)
    ax.set_xlabel(r"$\hat p^{(1)}(x_i) - \hat p^{(0)}(x_i)$")
    ax.set_ylabel("positions")
    ax.set_yscale("symlog", linthresh=1)  # the mass piles up near 0; a log scale shows the tails
    # At most 6 x ticks and one y tick per decade shown: long or narrow ranges never overlap labels.
    ax.xaxis.set_major_locator(MaxNLocator(nbins=6))
    ax.yaxis.set_major_locator(SymmetricalLogLocator(base=10, linthresh=1, subs=[1.0]))
    lo, hi = summary.get("frac_improved_ci", [float("nan")] * 2)
    ax.set_title("\n".join(textwrap.wrap(title, 70)) + f"\nimproved at {summary['frac_improved']:.1%} (95% CI "
                 f"{lo:.1%}-{hi:.1%}) of {summary['n_positions']} positions", fontsize=9)
    fig.tight_layout()
    return fig
