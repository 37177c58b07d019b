r"""How an engine step's flat rows carry RPT's offsets and true positions without new model inputs.

A step feeds, for one request with ``L`` tokens the engine holds as final (prompt and emitted), the
rows (in cache-slot order, slot ``s`` of the request):

* NTP rows: ``x_{L-1}`` (the engine's re-fed last token), then the tentative tail ``x_L .. x_n``, each
  at its own slot = its position (offset row 0, causal);
* for each lag ``l = 1 .. lags``, one PTP chain ``x_{n-l+1} .. x_n`` in the slots after ``n`` (chain
  ``l`` starts at slot ``n + 1 + l(l-1)/2``), offset rows ``1 .. l`` (eq. 8: the chain of lag ``l``
  proposes ``x_{n-l}`` from ``x_{<n-l}`` and ``x_{n-l+1..n}``).

A chain token is fed as the id ``token + V * code`` with ``code = l(l-1)/2 + m + 1`` (its index ``m``
in the chain): the model reads the offset row ``m + 1`` and the true position ``slot - l(l+1)/2`` from
the code, a constant per code. So the engine's own ``input_ids`` and ``positions`` carry everything,
and the token id ``id mod V`` is what every other part of the engine sees.
"""

from __future__ import annotations

import torch


def chain_code(lag: int, m: int) -> int:
    """The code of the ``m``-th token (0-based) of the chain of lag ``lag``."""
    return lag * (lag - 1) // 2 + m + 1


def chain_rows(lags: int) -> int:
    """Rows the chains of lags ``1 .. lags`` take: ``lags (lags + 1) / 2``."""
    return lags * (lags + 1) // 2


def code_tables(window: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(offset_row, shift, lag)`` per code ``0 .. chain_rows(window - 1)`` (code 0: an NTP row):
    the offset-table row the code's token adds, ``slot - true position``, and its chain's lag."""
    offset, shift, lag = [0], [0], [0]
    for l in range(1, window):
        for m in range(l):
            offset.append(m + 1)
            shift.append(l * (l + 1) // 2)
            lag.append(l)
    return torch.tensor(offset), torch.tensor(shift), torch.tensor(lag)


def chain_ids(tokens: list[int], n: int, lags: int, vocab_size: int) -> list[int]:
    """The ids of the chains of lags ``1 .. lags`` ending at position ``n`` of ``tokens``."""
    return [tokens[n - l + 1 + m] + vocab_size * chain_code(l, m) for l in range(1, lags + 1) for m in range(l)]
