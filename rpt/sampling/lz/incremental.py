r"""The LZ match lengths carried along a growing context: O(batch * W) per new token instead of the
from-scratch O(batch * W * B) comparison of :func:`~rpt.sampling.lz.definition.lz_match_lengths`.

Appending ``x`` to the window ``t_0..t_{m-1}`` (natural order), the token after ``t_c`` gains a
one-token-longer match exactly when ``t_c = x`` (:func:`grow_matches`). :func:`append_token` applies
it to a fixed-width device window (vLLM's per-row state, :mod:`rpt.integrations.lz_rows`);
:class:`LZMatchTracker` to a processor's context, recomputing from scratch when a call does not
extend the previous one by one token.
"""

from __future__ import annotations

import torch

from rpt.sampling.lz.definition import lz_match_lengths


def grow_matches(tokens: torch.Tensor, s: torch.Tensor, new: torch.Tensor, buffer: int) -> torch.Tensor:
    r"""One token ``new [rows, 1]`` appended after the window ``tokens [rows, m]`` with match lengths
    ``s``: ``grown[:, c]`` = :math:`[t_c = x]\min(s_c + 1, B)`, the new match length of the token
    that follows column c (``new`` itself for the last column). Gaps (-1) never match."""
    return (s + 1).clamp_(max=buffer).masked_fill_(tokens != new, 0)


def append_token(tokens: torch.Tensor, s: torch.Tensor, new: torch.Tensor, buffer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`grow_matches` in a fixed-width window: ``tokens`` right-aligned with -1 gaps, the oldest
    column dropped. The token that follows column c moves to column c, so the new ``s`` is ``grown``
    as it stands. O(rows * W); ``s`` may exceed the tokens before a column of a full window, which
    :func:`~rpt.sampling.lz.definition.cost_table` caps (as :class:`LZMatchTracker`)."""
    grown = grow_matches(tokens, s, new, buffer)
    return torch.cat([tokens[:, 1:], new.to(tokens.dtype)], 1), grown


class LZMatchTracker:
    r""":func:`~rpt.sampling.lz.definition.lz_match_lengths` carried from call to call while the context grows by
    one token.

    Appending ``x`` to the window ``t_0..t_{m-1}`` (natural order), the token after ``t_c`` gains a
    one-token-longer match exactly when ``t_c = x``:
    :math:`s'_{c+1} = [t_c = x]\min(s_c + 1, B)`, and the first token's is 0 (nothing before it in
    the window; :func:`~rpt.sampling.lz.definition.cost_table` keeps every match inside the window).
    O(batch * W) per step instead of O(batch * W * B). A call that does not extend the previous one
    by one token (new batch, a corrected earlier token, a shorter prefix) recomputes from scratch.
    The check reads tensor contents on the host: meant for CPU decoding.
    """

    def __init__(self, window: int, buffer: int) -> None:
        self.window, self.buffer = window, buffer
        self._tokens: torch.Tensor | None = None
        self._s = torch.empty(0, dtype=torch.long)

    def _extends(self, context: torch.Tensor) -> bool:
        seen = self._tokens
        if seen is None or seen.shape[0] != context.shape[0] or seen.device != context.device:
            return False
        prev = context[:, :-1][:, -self.window:]
        return prev.shape == seen.shape and torch.equal(prev, seen)

    def __call__(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``tokens`` and ``s`` as :func:`~rpt.sampling.lz.definition.lz_match_lengths`, except that ``s`` of
        column c may exceed c (a match reaching out of the window); :func:`~rpt.sampling.lz.definition.cost_table`
        applies ``min(s, c)``."""
        if context.shape[1] > 0 and self._extends(context):
            new = context[:, -1:]
            grown = grow_matches(self._tokens, self._s, new, self.buffer)
            w = self.window
            self._s = torch.cat([grown.new_zeros(grown.shape[0], 1), grown], 1)[:, -w:]
            self._tokens = torch.cat([self._tokens, new], 1)[:, -w:]
        else:
            self._tokens, self._s, _ = lz_match_lengths(context, self.window, self.buffer)
            self._tokens = self._tokens.clone()  # the caller may reuse its buffer
        return self._tokens, self._s
