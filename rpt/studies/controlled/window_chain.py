r"""The exact law of a ``w``-token window under NTP sampling and after ``k`` RPT iterations (eq. 4 / 6).

Given a context ``c`` and conditionals (a model's, or the truth's), sampling the next ``w`` tokens
``x_0..x_{w-1}`` (``x_0`` oldest) is:

* **NTP** (``k = 0``): ``x_j ~ p(x_j | c, x_<j)`` for ``j = 0..w-1``;
* **one RPT iteration** (eq. 6, sampled PTP): for ``j = 0..w-2`` resample
  ``x_j ~ p(x_j | c, x_<j, x_{j+1..w-1})`` (PTP-l with ``l = w-1-j``), then re-propose the newest
  token ``x_{w-1} ~ p(x_{w-1} | c, x_<w-1)`` (NTP).

Every step replaces one coordinate by a draw from a conditional of all the others, so on the law
``mu`` of the window (a ``[B] + [V] * w`` array) it is exact and cheap:
``mu' = mu.sum(axis=j, keepdims=True) * C_j`` where ``C_j`` holds the conditional with the new value
on axis ``j`` and the conditioning values on the other axes. With ``w = 2`` this is eq. 4:
``x_i ~ P(x_i | x_{i+1})``, then ``x_{i+1} ~ N(x_{i+1} | x_i)``.

:class:`WindowConditionals` is the tables one needs: ``init[j]`` (``[B] + [V] * (j + 1)``, the NTP
chain rule) and ``resample[j]`` (``[B] + [V] * w``). :func:`truth_conditionals` builds them from a
true joint (then every step is a Gibbs update and the joint is invariant: the tests' check), and
:func:`noisy_conditionals` applies the paper's Sec. 3 noise model (eq. 33) to them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class WindowConditionals:
    init: list[np.ndarray]  # init[j]: p(x_j | c, x_<j), shape [B] + [V] * (j + 1), last axis x_j
    resample: list[np.ndarray]  # resample[j]: C_j(x_j' | others), shape [B] + [V] * w, axis 1 + j is x_j'

    @property
    def window(self) -> int:
        return len(self.init)


def ntp_joint(cond: WindowConditionals) -> np.ndarray:
    """``k = 0``: the chain rule, ``prod_j p(x_j | c, x_<j)`` as a ``[B] + [V] * w`` array."""
    w = cond.window
    joint = cond.init[0]
    for j in range(1, w):
        joint = joint[..., None] * cond.init[j]
    return joint


def resample_step(joint: np.ndarray, table: np.ndarray, axis: int) -> np.ndarray:
    """Replace window coordinate ``axis`` by a draw from ``table``: ``sum_{x_j} mu * C_j``."""
    return joint.sum(axis=1 + axis, keepdims=True) * table


def rpt_iteration(joint: np.ndarray, cond: WindowConditionals) -> np.ndarray:
    """One eq. 6 sweep: PTP resampling of ``x_0..x_{w-2}`` (oldest first), then NTP for ``x_{w-1}``."""
    for j in range(cond.window):
        joint = resample_step(joint, cond.resample[j], j)
    return joint


def joints_by_iters(cond: WindowConditionals, iters: int) -> list[np.ndarray]:
    """The window's law after ``k = 0..iters`` RPT iterations started from NTP."""
    joints = [ntp_joint(cond)]
    for _ in range(iters):
        joints.append(rpt_iteration(joints[-1], cond))
    return joints


def tv(joint: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Total variation ``0.5 * sum |joint - truth|`` per context: ``[B]``."""
    return 0.5 * np.abs(joint - truth).reshape(len(truth), -1).sum(axis=1)


def _normalise(x: np.ndarray, axis: int) -> np.ndarray:
    total = x.sum(axis=axis, keepdims=True)
    # A conditioning value of probability 0 has no conditional; any law will do (uniform).
    return np.where(total > 0, x / np.where(total > 0, total, 1.0), 1.0 / x.shape[axis])


def truth_conditionals(joint: np.ndarray) -> WindowConditionals:
    """The exact conditionals of a ``[B] + [V] * w`` joint: the NTP chain rule and full conditionals."""
    w = joint.ndim - 1
    init = []
    for j in range(w):
        prefix = joint.sum(axis=tuple(range(2 + j, 1 + w))) if j < w - 1 else joint  # law of x_0..x_j
        init.append(_normalise(prefix, axis=-1))
    resample = [_normalise(joint, axis=1 + j) for j in range(w)]
    return WindowConditionals(init, resample)


def noisy_conditionals(cond: WindowConditionals, eps_n: float, eps_p: float, seed: int) -> WindowConditionals:
    """The paper's noise model (eq. 33): every NTP row ``(1 - eps_n) p + eps_n n`` and every PTP row
    ``(1 - eps_p) p + eps_p n``, ``n`` a fresh U(0, 1) draw normalised, one per row. The newest
    token's resampling reuses its (noisy) NTP table: it is the same learned conditional."""
    rng = np.random.default_rng(seed)
    w = cond.window

    def noisy(table: np.ndarray, axis: int, eps: float) -> np.ndarray:
        n = rng.uniform(0.0, 1.0, size=table.shape)
        return (1.0 - eps) * table + eps * n / n.sum(axis=axis, keepdims=True)

    init = [noisy(t, -1, eps_n) for t in cond.init]
    resample = [noisy(cond.resample[j], 1 + j, eps_p) for j in range(w - 1)] + [init[-1]]
    return WindowConditionals(init, resample)
