"""Degenerate-repetition detector (LZ-penalty paper, Sec. 4.1 and its footnote 8).

The paper flags a generation as degenerate when "any substring [is] repeated at least 20 times",
found by a naive search for exact repetitions (and confirmed by an LLM judge we do not have).
Taken literally with no minimum length every text with 20 spaces would qualify, so the length
of the repeated substring is a parameter, and the default reading is the *loop* one a judge
confirms: the substring occurs ``min_repeats`` times back to back.

Definitions, for a sequence ``t`` (token ids, or the characters of a string):

* ``consecutive=True`` (default): degenerate iff some ``u`` with ``len(u) >= min_len`` has
  ``u * min_repeats`` as a contiguous slice of ``t``. With ``min_len=1`` on characters this is
  exactly ``re.search(r"(.+)\\1{19}", text)`` -- the naive regex -- without its backtracking.
* ``consecutive=False``: degenerate iff some substring of length ``>= min_len`` occurs at
  ``min_repeats`` non-overlapping places anywhere. Use a larger ``min_len`` (e.g. 8+ tokens) in
  this mode, or ordinary boilerplate counts as repetition.

Algorithms. Consecutive: ``u^R`` with ``|u| = m`` starts at ``i`` iff ``t[j] == t[j + m]`` for all
``j`` in ``[i, i + (R - 1) m)``, i.e. the boolean array ``t[m:] == t[:-m]`` has a run of ``(R - 1) m``
Trues. One vectorised comparison per ``m`` in ``[min_len, n / R]``: O(n^2 / R) numpy work, ~10 ms for
n = 10k tokens. Anywhere: if a longer substring has R non-overlapping occurrences so does its
length-``min_len`` prefix, so only ``min_len``-grams are counted (``np.unique`` over a sliding
window, then a greedy non-overlapping count for the frequent ones).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

MIN_REPEATS = 20


@dataclass(frozen=True)
class Repetition:
    """Evidence of a degenerate repetition: ``t[start:start + length]`` occurs ``repeats`` times
    (back to back from ``start`` in consecutive mode; ``start`` is the first occurrence otherwise)."""

    start: int
    length: int
    repeats: int


def _as_array(tokens: Sequence | np.ndarray | str) -> np.ndarray:
    if isinstance(tokens, str):
        return np.frombuffer(tokens.encode("utf-32-le"), dtype=np.uint32)
    if isinstance(tokens, np.ndarray):
        return tokens.reshape(-1)
    items = list(tokens)
    if all(isinstance(x, (int, np.integer)) for x in items):
        return np.asarray(items, dtype=np.int64)
    ids: dict = {}  # any hashable tokens (e.g. words): map to dense ids
    return np.asarray([ids.setdefault(x, len(ids)) for x in items], dtype=np.int64)


def _first_run(mask: np.ndarray, length: int) -> tuple[int, int] | None:
    """(start, run length) of the first run of >= ``length`` Trues in ``mask``, or None."""
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    long_enough = np.flatnonzero(ends - starts >= length)
    if long_enough.size == 0:
        return None
    k = long_enough[0]
    return int(starts[k]), int(ends[k] - starts[k])


def _consecutive(t: np.ndarray, min_len: int, min_repeats: int) -> Repetition | None:
    for m in range(min_len, len(t) // min_repeats + 1):
        run = _first_run(t[m:] == t[:-m], (min_repeats - 1) * m)
        if run is not None:
            start, length = run
            return Repetition(start=start, length=m, repeats=length // m + 1)
    return None


def _anywhere(t: np.ndarray, min_len: int, min_repeats: int) -> Repetition | None:
    if len(t) < min_len * min_repeats:
        return None
    windows = np.lib.stride_tricks.sliding_window_view(t, min_len)
    _, ids, counts = np.unique(windows, axis=0, return_inverse=True, return_counts=True)
    ids = ids.reshape(-1)
    best: Repetition | None = None
    for gram in np.flatnonzero(counts >= min_repeats):
        positions = np.flatnonzero(ids == gram)
        taken, next_free = 0, -1
        for p in positions:  # greedy left-to-right gives the maximum non-overlapping count
            if p >= next_free:
                taken, next_free = taken + 1, p + min_len
        if taken >= min_repeats and (best is None or positions[0] < best.start):
            best = Repetition(start=int(positions[0]), length=min_len, repeats=taken)
    return best


def find_repetition(
    tokens: Sequence | np.ndarray | str,
    min_len: int = 1,
    min_repeats: int = MIN_REPEATS,
    consecutive: bool = True,
) -> Repetition | None:
    """The evidence that ``tokens`` is degenerate (see the module docstring), or None.

    Consecutive mode reports the shortest repeated unit (then the earliest); anywhere mode the
    ``min_len``-gram whose first occurrence is earliest.
    """
    if min_len < 1 or min_repeats < 2:
        raise ValueError("need min_len >= 1 and min_repeats >= 2")
    t = _as_array(tokens)
    return (_consecutive if consecutive else _anywhere)(t, min_len, min_repeats)


def is_degenerate(
    tokens: Sequence | np.ndarray | str,
    min_len: int = 1,
    min_repeats: int = MIN_REPEATS,
    consecutive: bool = True,
) -> bool:
    """True if some substring of >= ``min_len`` tokens repeats >= ``min_repeats`` times."""
    return find_repetition(tokens, min_len, min_repeats, consecutive) is not None


def degenerate_rate(sequences: Iterable[Sequence | np.ndarray | str], **kwargs) -> float:
    """Fraction of ``sequences`` that are degenerate (0.0 for none)."""
    flags = [is_degenerate(s, **kwargs) for s in sequences]
    return sum(flags) / len(flags) if flags else 0.0
