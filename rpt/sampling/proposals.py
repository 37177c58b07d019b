r"""The proposal rules of both decoders, for logits ``z`` of a query and the processors of its position.

* NTP proposes ``x_t`` from ``warpers(penalties(z))``: the argmax when ``temperature == 0``, else a
  draw;
* PTP proposes ``x_j`` from ``q = penalties_j(z)`` (the penalties NTP had at position j, i.e. computed
  on ``x_{<j}``, when ``penalize_ptp``; none otherwise): the argmax of ``q`` with ``ptp_greedy`` (or
  greedy NTP), else a draw from ``warpers(q)``. It is accepted iff ``softmax(q)[proposal] >
  confidence`` (temperature 1, before truncation).

Draws are inverse-CDF draws at position-keyed uniforms (:mod:`rpt.sampling.randomness`): the
caller names each draw's key, so the same key and the same logits give the same token in any
decoder, batch or order.

Token healing is a hard constraint, not a penalty: it applies to PTP proposals whatever
``penalize_ptp`` says, and the tokens generated while it is active are never revisited (so a
correction can never break the re-spelled prompt text).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from rpt.sampling.config import TENSOR_KNOBS, SamplingConfig
from rpt.sampling.decode.proposal_layout import ProposalLayout
from rpt.sampling.processors import build_logits_processors, penalty_processors, warper_processors
from rpt.sampling.randomness import NTP, inverse_cdf, uniforms


def nonfinite(logits: torch.Tensor) -> torch.Tensor:
    """``[batch]`` bool: rows of ``logits`` ``[batch, ..., V]`` holding a NaN or ``+inf``, or all ``-inf``
    (one reduction: ``amax`` propagates NaN). A lone ``-inf`` is a legal ban, not an error."""
    top = logits.amax(-1)
    return ~torch.isfinite(top).reshape(top.shape[0], -1).all(-1)


def raise_nonfinite(rows: list[int]) -> None:
    """The error for rows whose logits :func:`nonfinite` flagged (no-op when ``rows`` is empty)."""
    if rows:
        raise ValueError(
            f"the model's logits hold NaN or inf (rows {rows}): a float16 overflow or broken weights; "
            "load the model in bfloat16 or float32"
        )


def first_argmax(scores: torch.Tensor) -> torch.Tensor:
    """``scores.argmax(-1)`` (the first maximum), in two levels on the CPU: torch's CPU argmax over a
    long last axis is a scalar loop (about 230 us for ``[64, 4096]``, 1 thread) while ``amax`` is
    vectorised, so the row maximum of 64-wide chunks, the first chunk holding the largest, and the
    argmax inside it take a quarter of that. The same index, ties included; elsewhere plain argmax."""
    batch, width = scores.shape
    if scores.device.type != "cpu" or width % 64 or width < 1024:
        return scores.argmax(-1)
    chunks = scores.reshape(batch, width // 64, 64)
    chunk = chunks.amax(-1).argmax(-1)  # the first chunk whose maximum is the row's
    inside = chunks[torch.arange(batch, device=scores.device), chunk].argmax(-1)
    return chunk * 64 + inside


def apply(procs: LogitsProcessorList, context: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """``procs(context, scores)`` for processors that take those two arguments (all of ours): a plain
    loop, because ``LogitsProcessorList.__call__`` reads each processor's ``inspect.signature``, which
    dynamo cannot trace (a graph break inside the compiled step, :mod:`rpt.sampling.decode.ntp_path`)."""
    for proc in procs:
        scores = proc(context, scores)
    return scores


def _probs(scores: torch.Tensor) -> torch.Tensor:
    # half-precision logits are softmaxed in float32; float32 / float64 stay as they are
    return torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))


def greedy_acceptance(scores: torch.Tensor, confidence: float | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(argmax, softmax(scores)[argmax] > confidence)`` per row. Overwrites ``scores`` (float32 or
    wider; half precision is promoted first, as :func:`_probs` does)."""
    tokens = first_argmax(scores)
    s = scores if scores.dtype.itemsize >= 4 else scores.float()
    # the argmax's score is the row maximum: amax, not a gather at the argmax (inductor's CUDA
    # scheduler asserted in can_fuse_horizontal on argmax -> gather -> exp -> sum over bf16 logits
    # at batch 1, on an H100: benchmarks/rpt_tail_compile.py)
    top = s.amax(-1, keepdim=True)
    # its probability is exp(0) / sum(exp(s - top)); in place, because a fresh [batch, V] softmax
    # buffer per lag per step is what grows the CPU's host time with the batch (RESULTS.md)
    return tokens, s.sub_(top).exp_().sum(-1).reciprocal() > confidence


def ntp_draws(config: SamplingConfig) -> int:
    """Draws per NTP query: one per RPT iteration (k + 1 keys, all from the same logits); 1 when greedy."""
    return 1 if config.greedy else config.rpt_iters + 1


class Proposer:
    """The NTP and PTP proposal rules of the module docstring, batched over rows.

    Args:
        config: the sampling knobs.
        prompt_length, pad_length: column conventions of the processors
            (:mod:`rpt.sampling.processors`) for the contexts the caller passes.
        healing: a :class:`~rpt.sampling.text.healing.TokenHealingLogitsProcessor`, or None.
        seeds: ``[batch]`` row seeds (int64, on the logits' device).
        knobs: a compiled step's knob tensor (:meth:`SamplingConfig.traced`, :mod:`rpt.sampling.processors`):
            the float knobs read from it, ``config`` naming which processors exist; None: the config's.
    """

    def __init__(self, config: SamplingConfig, prompt_length, seeds: torch.Tensor, pad_length=None,
                 healing: LogitsProcessor | None = None, knobs: torch.Tensor | None = None):
        self.config, self.seeds = config, seeds
        self.confidence = config.confidence if knobs is None else knobs[TENSOR_KNOBS.index("confidence")]
        self.ntp_procs = build_logits_processors(config, prompt_length, pad_length=pad_length, healing=healing,
                                                 knobs=knobs)
        penalties = penalty_processors(config, prompt_length, pad_length=pad_length, knobs=knobs) \
            if config.penalize_ptp else []
        self.ptp_procs = LogitsProcessorList(([healing] if healing is not None else []) + list(penalties))
        self.warpers = warper_processors(config, knobs)
        self.ptp_samples_greedy = config.ptp_greedy or config.greedy
        self.ntp_draws = ntp_draws(config)

    def ntp(self, context: torch.Tensor, logits: torch.Tensor, position) -> torch.Tensor:
        """``[B, ntp_draws]``: proposals for the token at ``position`` (``[B]`` or int, each row's own
        position) after ``context`` ``[B, T]`` from its logits ``[B, V]``; column i is the draw of
        RPT iteration i (all equal when greedy). May overwrite ``logits``."""
        scores = apply(self.ntp_procs, context, logits)
        if self.config.greedy:
            return first_argmax(scores)[:, None]
        u = uniforms(self.seeds, position, 0, NTP, draws=self.ntp_draws)
        return inverse_cdf(_probs(scores), u)

    def ptp(self, context: torch.Tensor, logits: torch.Tensor, position, iteration, lag: int
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens, accepted)``, each ``[B]``: proposals for ``x_j`` with ``context = x_{<j}``, drawn for
        window position ``position`` (t), ``iteration`` and ``lag = t - j``. May overwrite ``logits``."""
        scores = apply(self.ptp_procs, context, logits)
        if self.ptp_samples_greedy:  # the argmax and its probability
            return greedy_acceptance(scores, self.confidence)
        probs = _probs(scores)
        # no warper (temperature 1, no truncation): the draw's distribution is the acceptance's, so its
        # softmax is not computed twice (a [batch, V] pass per lag per step)
        dist = probs if not self.warpers else _probs(apply(self.warpers, context, scores))
        tokens = inverse_cdf(dist, uniforms(self.seeds, position, iteration, lag))[:, 0]
        return tokens, probs.gather(-1, tokens[:, None])[:, 0] > self.confidence


@dataclass
class CallProposals:
    """Every proposal of one decoder call, unpacked (:func:`call_proposals`): the common step reads its
    parts as ``[batch]`` tensors (:func:`rpt.sampling.decode.rpt_path.settle_flags`), the host their packed columns."""

    bad: torch.Tensor  # [batch] bool: the row's logits hold NaN / inf
    top: torch.Tensor | None  # [batch, draws]: NTP draws for column n + 1 (keep_top)
    prev: torch.Tensor | None  # [batch, draws]: NTP draws for column n (keep_prev)
    chains: list[tuple[torch.Tensor, torch.Tensor]]  # per lag: PTP (tokens [batch], accepted [batch] bool)

    def packed(self, layout: ProposalLayout) -> torch.Tensor:
        """``[batch, layout.width]`` int64 in ``layout``'s columns: the call's one transfer to the host."""
        parts = [self.bad[:, None].long()] + [p for p in (self.top, self.prev) if p is not None]
        for tokens, accepted in self.chains:
            parts += [tokens[:, None], accepted[:, None].long()]
        vals = torch.cat(parts, dim=1)
        if vals.shape[1] != layout.width:  # a shape, known while tracing: no synchronisation
            raise AssertionError(f"proposals of width {vals.shape[1]} for {layout}")
        return vals


def call_proposals(contexts, logits: torch.Tensor, n, position, fed: torch.Tensor | None, layout: ProposalLayout,
                   its: torch.Tensor | None, valid: list[torch.Tensor] | None = None) -> CallProposals:
    """Every proposal of a decoder call at column n: whether the row's logits hold NaN / inf; with
    ``keep_top`` the NTP draws for column n + 1 over ``x_{<= n}`` (``x_n = fed`` where given); with
    ``keep_prev`` those for n over ``x_{< n}``; per lag l, the PTP ``(token, accepted)`` for ``x_{n-l}``
    over ``x_{< n-l}``, keyed by iteration ``its[i]``.

    ``logits``: ``[batch, K, V]``, one query per proposal kind in that order; ``position``: each row's
    position of column n; ``contexts``: :class:`~rpt.sampling.decode.contexts.GrowingContexts` (eager) or
    :class:`~rpt.sampling.decode.contexts.RotatedContexts` (fixed width, inside ``torch.compile``); ``valid``:
    per lag, ``[batch]`` bool, whether ``x_{n-l}`` is a generated token (None: all are), where a chain
    reaching into the prompt is computed only to keep one graph for every column: its logits are not
    checked for NaN (its proposals are never read)."""
    # per query, before any processor edits the logits in place: [batch, K] (amax propagates NaN)
    finite = torch.isfinite(logits.amax(-1))
    ntp = int(layout.keep_top) + int(layout.keep_prev)  # the NTP queries come first, then one per lag
    flags = [~finite[:, q] for q in range(ntp)]
    flags += [~finite[:, ntp + i] if valid is None else ~finite[:, ntp + i] & valid[i] for i in range(len(layout.lags))]
    bad = flags[0]
    for flag in flags[1:]:  # [batch] ORs: no small reduction over the query axis
        bad = bad | flag
    top = prev = None
    if layout.keep_top:
        proposer, context = contexts.upto(n, fed)
        top = proposer.ntp(context, logits[:, 0], position + 1)
    if layout.keep_prev:
        proposer, context = contexts.upto(n - 1)
        prev = proposer.ntp(context, logits[:, ntp - 1], position)
    chains = []
    for i, lag in enumerate(layout.lags):
        proposer, context = contexts.upto(n - lag - 1)
        chains.append(proposer.ptp(context, logits[:, ntp + i], position, None if its is None else its[i], lag))
    return CallProposals(bad, top, prev, chains)


def block_proposals(contexts, logits: torch.Tensor, n, position, fed: torch.Tensor | None, layout: ProposalLayout,
                    its: torch.Tensor | None) -> torch.Tensor:
    """:func:`call_proposals` packed: ``[batch, layout.width]`` int64 in ``layout``'s columns."""
    return call_proposals(contexts, logits, n, position, fed, layout, its).packed(layout)
