"""The order in which training reads chunks: a seeded permutation per epoch, in O(1) memory.

``ChunkOrder(n, seed)(epoch, i)`` is the chunk read at place ``i`` of epoch ``epoch``: a
bijection of ``[0, n)`` computed by a balanced Feistel network (any round function gives a
permutation of the ``2^(2h)`` domain) with cycle walking (re-encrypt until the value falls in
``[0, n)``, which keeps it a permutation of ``[0, n)``). Nothing of size ``n`` is ever built, so
a 100B-token corpus costs no more memory than a small one and any sample index is found in
constant time -- which is what makes resuming at step 10k as cheap as at step 1.
"""

from __future__ import annotations

import numpy as np

MASK64 = (1 << 64) - 1
ROUNDS = 6


def _mix(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser on a uint64 array (wrapping arithmetic)."""
    x = (x ^ (x >> 30)) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> 27)) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> 31)


class ChunkOrder:
    def __init__(self, n: int, seed: int):
        if n < 1:
            raise ValueError(f"ChunkOrder needs n >= 1, got {n}")
        bits = max(2, (n - 1).bit_length())
        self.n, self.seed = n, seed
        self.half = (bits + 1) // 2
        self.mask = np.uint64((1 << self.half) - 1)

    def _keys(self, epoch: int) -> list[np.uint64]:
        base = ((self.seed & MASK64) * 0x9E3779B97F4A7C15 + epoch * 0xD1B54A32D192ED03) & MASK64
        return [np.uint64(int(_mix(np.array([(base + r) & MASK64], dtype=np.uint64))[0])) for r in range(ROUNDS)]

    def _encrypt(self, x: np.ndarray, keys: list[np.uint64]) -> np.ndarray:
        left, right = x >> np.uint64(self.half), x & self.mask
        for k in keys:
            left, right = right, left ^ (_mix(right ^ k) & self.mask)
        return (left << np.uint64(self.half)) | right

    def __call__(self, epoch: int, index) -> np.ndarray:
        """Chunk ids for the places ``index`` (an int or array in ``[0, n)``) of ``epoch``."""
        x = np.atleast_1d(np.asarray(index, dtype=np.uint64))
        keys = self._keys(epoch)
        y = self._encrypt(x, keys)
        outside = y >= self.n
        while outside.any():  # cycle walking: at most a few rounds, the domain is < 4n
            y[outside] = self._encrypt(y[outside], keys)
            outside = y >= self.n
        return y.astype(np.int64)
