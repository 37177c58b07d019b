"""A hidden Markov model over a small vocabulary: a data source whose distribution is known exactly.

``x_1, x_2, ...`` with hidden states ``s_t``: ``s_1 ~ start``, ``s_{t+1} ~ trans[s_t]``,
``x_t ~ emit[s_t]``. Everything the controlled experiment compares against comes from here:

* :func:`predictive_states` -- the forward algorithm: ``p(s_i | x_<i)`` for a batch of contexts;
* :func:`window_joint` -- the exact joint ``p(x_i, ..., x_{i+w-1} | x_<i)`` of the next ``w``
  tokens, a ``[B, V, ..., V]`` tensor (``w`` axes), by summing the hidden path out with matrix
  products (``V**w`` entries: small vocabularies only).

All arrays are ``numpy`` float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class HMM:
    start: np.ndarray  # [H]
    trans: np.ndarray  # [H, H], row s: law of the next state
    emit: np.ndarray  # [H, V], row s: law of the token

    @property
    def hidden(self) -> int:
        return self.trans.shape[0]

    @property
    def vocab(self) -> int:
        return self.emit.shape[1]

    def to_dict(self) -> dict:
        return {"start": self.start.tolist(), "trans": self.trans.tolist(), "emit": self.emit.tolist()}

    @classmethod
    def from_dict(cls, d: dict) -> HMM:
        return cls(*(np.asarray(d[k], dtype=np.float64) for k in ("start", "trans", "emit")))


def stationary_law(trans: np.ndarray) -> np.ndarray:
    """The stationary law of a positive row-stochastic matrix (left eigenvector for eigenvalue 1)."""
    h = trans.shape[0]
    system = trans.T - np.eye(h)
    system[-1, :] = 1.0  # replace one redundant equation by sum = 1
    rhs = np.zeros(h)
    rhs[-1] = 1.0
    law = np.linalg.solve(system, rhs)
    return law / law.sum()


def random_hmm(hidden: int, vocab: int, seed: int, stay: float = 0.0, trans_concentration: float = 1.0,
               emit_concentration: float = 1.0) -> HMM:
    """Dirichlet rows: ``trans = stay * I + (1 - stay) * Dir(trans_concentration)``, ``emit`` rows
    ``Dir(emit_concentration)``; the chain starts in its stationary law, so every position of a
    sample is distributed alike."""
    rng = np.random.default_rng(seed)
    trans = rng.dirichlet(np.full(hidden, trans_concentration), size=hidden)
    trans = stay * np.eye(hidden) + (1.0 - stay) * trans
    emit = rng.dirichlet(np.full(vocab, emit_concentration), size=hidden)
    return HMM(stationary_law(trans), trans, emit)


def sample(hmm: HMM, count: int, length: int, seed: int) -> np.ndarray:
    """``count`` independent sequences of ``length`` tokens, ``[count, length]`` int64."""
    rng = np.random.default_rng(seed)
    cum_trans, cum_emit = np.cumsum(hmm.trans, axis=1), np.cumsum(hmm.emit, axis=1)
    states = (rng.random(count)[:, None] > np.cumsum(hmm.start)[None, :]).sum(axis=1)
    out = np.empty((count, length), dtype=np.int64)
    for t in range(length):
        # Inverse-CDF draws, vectorised over sequences; min() guards against round-off at the top.
        out[:, t] = np.minimum((rng.random(count)[:, None] > cum_emit[states]).sum(axis=1), hmm.vocab - 1)
        states = np.minimum((rng.random(count)[:, None] > cum_trans[states]).sum(axis=1), hmm.hidden - 1)
    return out


def predictive_states(hmm: HMM, contexts: np.ndarray) -> np.ndarray:
    """Forward algorithm: ``p(s_i | x_<i)`` for each row of ``contexts`` ``[B, L]`` -> ``[B, H]``."""
    belief = np.broadcast_to(hmm.start, (len(contexts), hmm.hidden)).copy()
    for t in range(contexts.shape[1]):
        belief = belief * hmm.emit[:, contexts[:, t]].T  # condition on x_t ...
        belief /= belief.sum(axis=1, keepdims=True)
        belief = belief @ hmm.trans  # ... and step to s_{t+1}
    return belief


def window_joint(hmm: HMM, belief: np.ndarray, window: int) -> np.ndarray:
    """``p(x_i..x_{i+w-1} | x_<i)`` from ``belief = p(s_i | x_<i)`` ``[B, H]``: ``[B] + [V] * w``.

    ``joint[x_0..x_{w-1}] = sum_s belief(s_0) prod_j emit(s_j, x_j) trans(s_j, s_{j+1})``: carry
    ``alpha[B, x_0..x_j, s_j]`` forward one token at a time.
    """
    alpha = belief[:, None, :] * hmm.emit.T[None, :, :]  # [B, x_0, s_0]
    for _ in range(1, window):
        alpha = alpha @ hmm.trans  # [B, ..., s_j]
        alpha = alpha[..., None, :] * hmm.emit.T  # [B, ..., x_j, s_j]
    return alpha.sum(axis=-1)


def token_nll(hmm: HMM, docs: np.ndarray) -> np.ndarray:
    """``-log p(x_t | x_<t)`` of every token of ``docs`` ``[B, T]`` under the source (exact)."""
    belief = np.broadcast_to(hmm.start, (len(docs), hmm.hidden)).copy()
    out = np.empty(docs.shape)
    for t in range(docs.shape[1]):
        likelihood = hmm.emit[:, docs[:, t]].T  # [B, H]
        out[:, t] = -np.log((belief * likelihood).sum(axis=1))
        belief = belief * likelihood
        belief /= belief.sum(axis=1, keepdims=True)
        belief = belief @ hmm.trans
    return out
