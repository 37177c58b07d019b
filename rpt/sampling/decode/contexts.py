r"""The processors' view of the rows' tokens: the context ``x_{<= c}`` a proposal is conditioned on.

A proposal at column c + 1 (NTP) or of the token after column c (PTP, ``x_j`` with ``j = c + 1``) runs
the penalties on the row's tokens through column c. Two ways to hand them over, with the same
meaning (:func:`rpt.sampling.proposals.block_proposals` takes either):

* :class:`GrowingContexts` (eager): the slice ``seqs[:, : c + 1]`` and the decoder's own
  :class:`~rpt.sampling.proposals.Proposer`, whose column conventions (prompt width W, left padding)
  fit every such slice. Its width grows every step: under ``torch.compile`` a new graph per step.
* :class:`RotatedContexts` (compiled): the whole fixed-width layout ``[batch, capacity]``, *rotated*
  so that column c is the last one: ``ctx[:, j] = seqs[:, (j + c + 1) % capacity]``, with c a 0-dim
  tensor. Its first ``capacity - 1 - c`` columns (the layout's columns past c) are declared left
  padding (``shift + pads`` per row) and the prompt ``shift + W`` columns wide: the same conventions
  moved by the shift, so every penalty sees the tokens it sees eagerly, right-aligned as the LZ
  window needs (repetition and frequency / presence send ignored columns to a spare vocabulary
  column, LZ treats them as gaps). One shape for every step, so one graph for a whole decode.

``upto(c, last)`` returns ``(proposer, context)``; ``last`` (``[batch]``, optional) replaces the token
at column c (a decoder feeding a guess there, :mod:`rpt.sampling.decode.driver`).
"""

from __future__ import annotations

import torch

from rpt.sampling.proposals import Proposer


class GrowingContexts:
    """Eager contexts: slices of the layout ``seqs``, proposed on by ``proposer`` (conventions of width W)."""

    def __init__(self, proposer: Proposer, seqs: torch.Tensor):
        self.proposer, self.seqs = proposer, seqs

    def upto(self, c: int, last: torch.Tensor | None = None) -> tuple[Proposer, torch.Tensor]:
        if last is None:
            return self.proposer, self.seqs[:, : c + 1]
        return self.proposer, torch.cat([self.seqs[:, :c], last[:, None]], 1)


class RotatedContexts:
    """Fixed-width contexts of the whole layout ``seqs`` ``[batch, capacity]`` (module docstring).

    ``prompt``: ``[batch]`` all W (a tensor, so the graph does not depend on the prompt width);
    ``pads``: ``[batch]`` each row's left padding; ``knobs``: the state's knob tensor (the config then the
    traced one, :meth:`~rpt.sampling.config.SamplingConfig.traced`). A Proposer is built per context: under compile,
    dynamo runs its constructors once while tracing and the graph holds only tensor operations.
    """

    def __init__(self, config, seeds: torch.Tensor, seqs: torch.Tensor, prompt: torch.Tensor, pads: torch.Tensor,
                 knobs: torch.Tensor | None = None):
        self.config, self.seeds, self.seqs, self.prompt, self.pads = config, seeds, seqs, prompt, pads
        self.knobs = knobs
        self.cols = torch.arange(seqs.shape[1], device=seqs.device)

    def upto(self, c: torch.Tensor, last: torch.Tensor | None = None) -> tuple[Proposer, torch.Tensor]:
        width = self.seqs.shape[1]
        shift = width - 1 - c  # the rotated context's leading columns: the layout's columns past c
        context = self.seqs.index_select(1, (self.cols + (c + 1)) % width)
        if last is not None:
            context = torch.cat([context[:, :-1], last[:, None]], 1)
        return Proposer(self.config, self.prompt + shift, self.seeds, pad_length=self.pads + shift,
                        knobs=self.knobs), context
