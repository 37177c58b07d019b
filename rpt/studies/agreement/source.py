r"""The agreement-pairs source (docs/agreement_preregistration.md): a sequence source where the *forward* law of a token is
hard for a small model and its *backward* law given the next token is a small table.

A document is ``prefix`` uniform contents, then ``pairs`` pairs ``t_j c_j`` (a tag before the content
it agrees with, as "a"/"an" before a noun). Contents are token ids ``0..C-1``, tags ``C..C+T-1``.
Each pair is drawn jointly given the earlier contents ``h`` (``h[-l]`` = the content ``l`` pairs back):

    pi(t, c | h)  ∝  exp(J[t, c] + sum_{l in lags} U_l[h[-l], c])

With the lags ``(2, 3, 4)`` (lag 1 skipped) the next pair does not depend on ``c_j``. So:

* **tag-first** windows (context cut before a tag): the next two tokens are ``(t_j, c_j)`` with law
  ``pi(t, c | h)``. Its first token's law, the tag marginal ``sum_c pi(t, c | h)``, is a log-sum-exp
  over 16 contents of three lagged tables: not log-additive in the lags (hard for a small model);
  the NTP conditional ``N(c | t, h) ∝ exp(J[t, c] + sum U)`` is log-additive; the PTP conditional
  ``P(t | c, h) ∝ exp(J[t, c])`` does not depend on the context at all (an 8 x 16 table);
* **content-first** windows (cut after a tag ``t_j``): the next two are ``(c_j, t_{j+1})`` with law
  ``N(c | t_j, h) x (tag marginal of pair j + 1)``, a product (the written form is general: the
  next pair's law is computed for each candidate ``c_j``, so lag 1 in ``lags`` would be exact too).

Everything exact is closed form or a sum over the last ``max(lags)`` contents (``C ** 4`` states):
the window joints, every token's log-likelihood, the document entropy, the law of the lagged
contents at any pair, and the best log-additive fit of the tag marginal (what a model that only adds
per-lag scores can reach). Data for ``train.py`` reuse the controlled study's writer and tokenizer.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import asdict, dataclass

import numpy as np

from rpt.result_files import write_json
from rpt.studies.controlled.source import SourceFiles, write_documents, write_tokenizer


@dataclass(frozen=True)
class Design:
    """Every parameter of the source and of its evaluation (docs/agreement_preregistration.md)."""

    contents: int = 16
    tags: int = 8
    prefix: int = 4  # uniform contents before the first pair
    pairs: int = 30
    lags: tuple[int, ...] = (2, 3, 4)
    lag_scale: float = 3.0  # U_l = lag_scale * N(0, 1), drawn for each l in ``lags`` in order ...
    agreement_scale: float = 1.0  # ... then J = agreement_scale * N(0, 1): default_rng(source_seed)
    source_seed: int = 0
    train_docs: int = 20000  # default_rng(source_seed + 1)
    val_docs: int = 500  # default_rng(source_seed + 2)
    contexts: int = 1000  # evaluation documents, default_rng(eval_seed)
    eval_seed: int = 54321
    tag_first_cut: int = 32  # context length of the tag-first windows; content-first: one more

    def __post_init__(self):
        if min(self.lags) < 1 or max(self.lags) > self.prefix:
            raise ValueError(f"lags {self.lags} must lie in 1..prefix ({self.prefix})")
        if (self.tag_first_cut - self.prefix) % 2 or not self.prefix <= self.tag_first_cut <= self.doc_len - 3:
            raise ValueError(f"tag_first_cut {self.tag_first_cut} must start a pair that is followed by another")

    @property
    def vocab(self) -> int:
        return self.contents + self.tags

    @property
    def doc_len(self) -> int:
        return self.prefix + 2 * self.pairs

    @property
    def cuts(self) -> dict[str, int]:
        return {"tag_first": self.tag_first_cut, "content_first": self.tag_first_cut + 1}

    def to_dict(self) -> dict:
        return {**asdict(self), "lags": list(self.lags)}

    @classmethod
    def from_dict(cls, d: dict) -> Design:
        return cls(**{**d, "lags": tuple(d["lags"])})

    def source_dict(self) -> dict:
        """The fields the written samples depend on (a change means new data and new models)."""
        d = self.to_dict()
        return {k: d[k] for k in ("contents", "tags", "prefix", "pairs", "lags", "lag_scale", "agreement_scale",
                                  "source_seed", "train_docs", "val_docs")}


@dataclass(frozen=True)
class Params:
    U: np.ndarray  # [len(lags), C, C]: U[i][past content, new content] for lag lags[i]
    J: np.ndarray  # [T, C]


def make_params(design: Design) -> Params:
    rng = np.random.default_rng(design.source_seed)
    c = design.contents
    U = np.stack([design.lag_scale * rng.standard_normal((c, c)) for _ in design.lags])
    J = design.agreement_scale * rng.standard_normal((design.tags, c))
    return Params(U, J)


# ---- the pair law --------------------------------------------------------------------------------------
def _log_softmax(x: np.ndarray, axis) -> np.ndarray:
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def pair_log_law(params: Params, design: Design, history: np.ndarray) -> np.ndarray:
    """``log pi(t, c | h)`` as ``[..., T, C]`` from ``history[..., K]`` (the last ``K >= max(lags)``
    contents, oldest first: ``history[..., -l]`` is ``h[-l]``)."""
    score = sum(params.U[i][history[..., -lag]] for i, lag in enumerate(design.lags))  # [..., C]
    return _log_softmax(params.J + score[..., None, :], axis=(-2, -1))


def sample(params: Params, design: Design, count: int, seed: int) -> np.ndarray:
    """``count`` documents of ``doc_len`` token ids, ``[count, doc_len]`` int64, from ``default_rng(seed)``:
    the prefix contents (``integers``), then per pair one inverse-CDF draw (``random``) over the
    ``T x C`` pairs in C order (tag-major)."""
    rng = np.random.default_rng(seed)
    c = design.contents
    docs = np.empty((count, design.doc_len), dtype=np.int64)
    docs[:, :design.prefix] = rng.integers(0, c, size=(count, design.prefix))
    history = docs[:, :design.prefix].copy()
    for j in range(design.pairs):
        cdf = np.cumsum(np.exp(pair_log_law(params, design, history)).reshape(count, -1), axis=1)
        u = rng.random(count)
        # min() guards against round-off at the top of the CDF.
        pair = np.minimum((u[:, None] > cdf).sum(axis=1), design.tags * c - 1)
        tag, content = np.divmod(pair, c)
        docs[:, design.prefix + 2 * j] = c + tag
        docs[:, design.prefix + 2 * j + 1] = content
        history = np.concatenate([history[:, 1:], content[:, None]], axis=1)
    return docs


def contents_before(design: Design, contexts: np.ndarray, pair: int) -> np.ndarray:
    """The last ``prefix`` contents before pair ``pair`` (0-based) of each context: ``[B, prefix]``."""
    cols = list(range(design.prefix)) + [design.prefix + 2 * k + 1 for k in range(pair)]
    return contexts[:, cols[-design.prefix:]]


def window_joint(params: Params, design: Design, contexts: np.ndarray) -> np.ndarray:
    """The exact law of the next two tokens after each context ``[B, L]`` (all of one length, a pair's
    start or its tag): ``[B, V, V]``, zero outside the tokens the structure allows."""
    b, length = contexts.shape
    c, t, v = design.contents, design.tags, design.vocab
    j, after_tag = divmod(length - design.prefix, 2)
    if length < design.prefix or j >= design.pairs - after_tag:
        raise ValueError(f"contexts of {length} tokens: no two-token window of this source follows them")
    history = contents_before(design, contexts, j)
    law = np.exp(pair_log_law(params, design, history))  # [B, T, C]
    joint = np.zeros((b, v, v))
    if not after_tag:  # tag-first: (t_j, c_j)
        joint[:, c:, :c] = law
        return joint
    tag = contexts[:, -1] - c
    if (tag < 0).any() or (tag >= t).any():
        raise ValueError("a content-first context must end with a tag")
    content = law[np.arange(b), tag]  # [B, C]
    content = content / content.sum(axis=1, keepdims=True)  # N(c | t_j, h)
    # The next pair's law for each candidate c_j: the history with c_j appended.
    cand = np.concatenate([np.repeat(history[:, None, 1:], c, axis=1), np.broadcast_to(np.arange(c), (b, c))[..., None]],
                          axis=2)  # [B, C, prefix]
    next_tag = np.exp(pair_log_law(params, design, cand)).sum(axis=-1)  # [B, c_j, T]
    joint[:, :c, c:] = content[:, :, None] * next_tag
    return joint


def token_log_likelihood(params: Params, design: Design, docs: np.ndarray) -> np.ndarray:
    """``log p(x_t | x_<t)`` of every token of ``docs`` ``[n, doc_len]`` under the source (exact)."""
    n, c = len(docs), design.contents
    out = np.empty(docs.shape)
    out[:, :design.prefix] = -np.log(c)
    history = docs[:, :design.prefix]
    for j in range(design.pairs):
        log_law = pair_log_law(params, design, history)  # [n, T, C]
        tag, content = docs[:, design.prefix + 2 * j] - c, docs[:, design.prefix + 2 * j + 1]
        log_tag = np.logaddexp.reduce(log_law, axis=2)[np.arange(n), tag]
        out[:, design.prefix + 2 * j] = log_tag
        out[:, design.prefix + 2 * j + 1] = log_law[np.arange(n), tag, content] - log_tag
        history = np.concatenate([history[:, 1:], content[:, None]], axis=1)
    return out


# ---- exact laws over the lagged contents ---------------------------------------------------------------
# A pair's law depends on the contents at the lags only; the contents themselves form a Markov chain on
# the last K = max(lags) of them. Expectations over pairs are sums over the C ** len(lags) lag tuples,
# weighted by the law of the lagged contents, which follows from the chain's law (C ** K states).
def lag_tuples(design: Design) -> np.ndarray:
    """Every lag tuple ``(h[-l] for l in lags)``, ``[C ** len(lags), len(lags)]`` (C order)."""
    return np.array(list(itertools.product(range(design.contents), repeat=len(design.lags))), dtype=np.int64)


def lagged_pair_law(params: Params, design: Design) -> np.ndarray:
    """``pi(t, c | lag tuple)`` for every lag tuple: ``[C ** len(lags), T, C]``."""
    tuples = lag_tuples(design)
    hist = np.zeros((len(tuples), max(design.lags)), dtype=np.int64)
    for i, lag in enumerate(design.lags):
        hist[:, -lag] = tuples[:, i]
    return np.exp(pair_log_law(params, design, hist))


def _state_index(design: Design) -> np.ndarray:
    """For every history of the last K contents (``[C] * K``, oldest first), the row of its lag tuple."""
    k, c = max(design.lags), design.contents
    states = np.stack(np.meshgrid(*[np.arange(c)] * k, indexing="ij"), axis=-1)
    return sum(states[..., -lag] * c ** (len(design.lags) - 1 - i) for i, lag in enumerate(design.lags))


def history_laws(params: Params, design: Design, pair_law: np.ndarray | None = None) -> list[np.ndarray]:
    """The exact law of the last ``K`` contents before each pair, ``laws[j]`` ``[C] * K`` (j = 0..pairs)."""
    k, c = max(design.lags), design.contents
    pair_law = lagged_pair_law(params, design) if pair_law is None else pair_law
    next_content = pair_law.sum(axis=1)[_state_index(design)]  # [C] * K + [C]
    law = np.full([c] * k, float(c) ** -k)  # the prefix's last K contents: uniform
    laws = [law]
    for _ in range(design.pairs):
        law = (law[..., None] * next_content).sum(axis=0)  # drop the oldest content, append c_j
        laws.append(law)
    return laws


def lag_law(law: np.ndarray, design: Design) -> np.ndarray:
    """A ``[C] * K`` history law as a law over the lag tuples, ``[C ** len(lags)]`` (rows of :func:`lag_tuples`)."""
    out = np.zeros(design.contents ** len(design.lags))
    np.add.at(out, _state_index(design).reshape(-1), law.reshape(-1))
    return out


def entropy(params: Params, design: Design, laws: list[np.ndarray] | None = None) -> dict:
    """The exact entropy of a document (nats), its per-token mean over the ``doc_len`` tokens, and the
    mean entropy of the tag and of the content tokens (over the pairs). ``laws``: :func:`history_laws`'s,
    if already computed."""
    pair = lagged_pair_law(params, design)
    laws = laws or history_laws(params, design, pair)
    tag = pair.sum(axis=-1)
    h_pair = -(pair * np.log(pair)).sum(axis=(-2, -1))
    h_tag = -(tag * np.log(tag)).sum(axis=-1)
    weights = np.stack([lag_law(laws[j], design) for j in range(design.pairs)])  # [pairs, tuples]
    per_pair, per_pair_tag = weights @ h_pair, weights @ h_tag
    total = design.prefix * np.log(design.contents) + per_pair.sum()
    return {"document": float(total), "per_token": float(total / design.doc_len),
            "tag_token": float(per_pair_tag.mean()), "content_token": float((per_pair - per_pair_tag).mean())}


# ---- the best log-additive fit of the tag marginal ------------------------------------------------------
def log_additive_fit(params: Params, design: Design, pair: int, laws: list[np.ndarray] | None = None) -> dict:
    """The tag marginal at pair ``pair``, ``m(t | h) = sum_c pi(t, c | h)``, fitted by the best law of the
    form ``q(t | h) ∝ exp(b[t] + sum_l W_l[h[-l], t])`` (minimum expected ``KL(m || q)`` under the exact
    law of the lagged contents): the tag error a model that only adds per-lag scores is left with.
    The content conditional ``N(c | t, h)`` is of this form exactly (its floor is 0)."""
    from scipy.optimize import minimize

    n_lags, c, t = len(design.lags), design.contents, design.tags
    grid = [c] * n_lags
    weight = lag_law((laws or history_laws(params, design))[pair], design).reshape(grid)[..., None]
    target = lagged_pair_law(params, design).sum(axis=-1).reshape(grid + [t])  # [C] * lags + [T]

    def logits(x):
        # b[t] + sum_l W_l[h[-l], t] as a sum of broadcast tables (no matrix products: BLAS threads on
        # a busy CPU cost more than this whole fit)
        w = x[t:].reshape(n_lags, c, t)
        return x[:t] + sum(w[i].reshape([c if a == i else 1 for a in range(n_lags)] + [t]) for i in range(n_lags))

    def objective(x):
        log_q = _log_softmax(logits(x), axis=-1)
        loss = -(weight * target * log_q).sum()
        resid = weight * (np.exp(log_q) - target)  # d loss / d logits
        grads = [resid.sum(axis=tuple(a for a in range(n_lags) if a != i)) for i in range(n_lags)]
        return loss, np.concatenate([resid.reshape(-1, t).sum(axis=0), *(g.reshape(-1) for g in grads)])

    res = minimize(objective, np.zeros(t + n_lags * c * t), jac=True, method="L-BFGS-B",
                   options={"maxiter": 2000, "gtol": 1e-8, "ftol": 1e-12})
    b, w = res.x[:t], res.x[t:].reshape(n_lags, c, t)
    fit = np.exp(_log_softmax(logits(res.x), axis=-1))
    weight = weight[..., 0]
    tv = 0.5 * np.abs(fit - target).sum(axis=-1)
    kl = (target * (np.log(target) - np.log(fit))).sum(axis=-1)
    uniform_tv = 0.5 * np.abs(target - 1.0 / t).sum(axis=-1)
    return {"pair": pair, "tv": float((weight * tv).sum()), "kl": float((weight * kl).sum()), "converged": bool(res.success),
            "tv_of_uniform": float((weight * uniform_tv).sum()), "bias": b.tolist(), "weights": w.tolist()}


# ---- the evaluation windows and the files for train.py ---------------------------------------------------
@dataclass
class Windows:
    """One window type's evaluation contexts and the true joint of the next two tokens after each."""

    name: str
    contexts: np.ndarray  # [B, L]
    joint: np.ndarray  # [B, V, V]
    first: np.ndarray  # the token ids the first window token can take (its support)
    second: np.ndarray


def evaluation_windows(params: Params, design: Design) -> dict[str, Windows]:
    """``contexts`` documents from ``default_rng(eval_seed)``, cut before a tag and after it."""
    docs = sample(params, design, design.contexts, design.eval_seed)
    contents, tags = np.arange(design.contents), np.arange(design.contents, design.vocab)
    out = {}
    for name, cut in design.cuts.items():
        first, second = (tags, contents) if name == "tag_first" else (contents, tags)
        out[name] = Windows(name, docs[:, :cut], window_joint(params, design, docs[:, :cut]), first, second)
    return out


def write_source(out_dir: str, design: Design) -> SourceFiles:
    """Samples as JSONL (one document of ``doc_len`` symbols per line, ``s<id>``), the tokenizer and
    ``agreement.json`` (the design and parameters); with ``seq_len = doc_len`` every packed training
    row is one document from its first token, as in the controlled study."""
    files = SourceFiles(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    params = make_params(design)
    write_documents(files.train, sample(params, design, design.train_docs, design.source_seed + 1))
    write_documents(files.validation, sample(params, design, design.val_docs, design.source_seed + 2))
    write_tokenizer(files.tokenizer, design.vocab)
    # last and atomic: prepare_source takes the source as cached once this file holds its design
    write_json(meta_path(out_dir), {"design": design.to_dict(), "U": params.U.tolist(), "J": params.J.tolist()})
    return files


def meta_path(source_dir: str) -> str:
    return os.path.join(source_dir, "agreement.json")
