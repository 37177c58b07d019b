r"""The LZ penalty as Hugging Face logits processors: one class per variant
(:class:`LZPenaltyLogitsProcessor` for ``codelength``, :class:`ClosestLongestLZLogitsProcessor`) over
the one :class:`LZMatcher`, which decides which columns of ``input_ids`` enter the window and
computes their match lengths, from scratch or carried along a decode. The definition and its
variants: :mod:`rpt.sampling.lz.definition`.
"""

from __future__ import annotations

import math

import torch
from transformers import LogitsProcessor

from rpt.sampling.lz.definition import check_sizes, check_variant, lz_match_lengths, mismatch_depth
from rpt.sampling.lz.incremental import LZMatchTracker
from rpt.sampling.lz.logits import apply_closest_longest, apply_codelength, penalty_table


class LZMatcher:
    """The match lengths a processor reads at each call: which columns of ``input_ids`` enter the
    window (``prompt_length``), then :func:`~rpt.sampling.lz.definition.lz_match_lengths` from scratch, or
    carried along a decode by :class:`~rpt.sampling.lz.incremental.LZMatchTracker` (``incremental``).
    Both LZ processors use one."""

    def __init__(self, window: int, buffer: int, prompt_length: int | torch.Tensor = 0,
                 incremental: bool | None = None) -> None:
        if isinstance(prompt_length, torch.Tensor):
            if prompt_length.dim() != 1 or prompt_length.dtype.is_floating_point:
                raise ValueError("prompt_length tensor must be a 1-D integer tensor [batch]")
        elif not isinstance(prompt_length, int) or prompt_length < 0:
            raise ValueError(f"prompt_length={prompt_length!r} is invalid: use an int >= 0 or a [batch] tensor")
        self.window, self.buffer, self.prompt_length, self.incremental = window, buffer, prompt_length, incremental
        self._tracker = LZMatchTracker(window, buffer)

    def context(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The columns that may enter the window and, for per-row prompts, their real lengths."""
        if isinstance(self.prompt_length, int):
            return input_ids[:, self.prompt_length:], None
        if self.prompt_length.device != input_ids.device:  # once; later calls reuse the moved copy
            self.prompt_length = self.prompt_length.to(input_ids.device)
        if self.prompt_length.shape[0] != input_ids.shape[0]:
            raise ValueError(f"prompt_length has {self.prompt_length.shape[0]} rows, input_ids {input_ids.shape[0]}")
        return input_ids, input_ids.shape[1] - self.prompt_length

    def match_lengths(
        self, context: torch.Tensor, lengths: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``tokens``, ``s`` and ``valid`` of the window (:func:`~rpt.sampling.lz.definition.lz_match_lengths`)."""
        # the tracker's extends-check reads tensor contents on the host: opt-in only (see the processor)
        if lengths is None and self.incremental:
            return (*self._tracker(context), None)
        return lz_match_lengths(context, self.window, self.buffer, lengths)

    def depth(
        self, input_ids: torch.Tensor, context: torch.Tensor, lengths: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``tokens``, ``B - s`` (:func:`~rpt.sampling.lz.definition.mismatch_depth`) and ``valid`` of the window."""
        w, b = self.window, self.buffer
        if lengths is None and not self.incremental and context.shape[1] >= w and input_ids.shape[1] >= w + b:
            # A full window reads the B columns before it as they are (prompt or older tokens):
            # cost_table caps a match at the tokens before its column, so no padded copy is needed.
            # Decided from shapes only (host metadata, no synchronisation).
            return context[:, -w:], mismatch_depth(input_ids[:, -(w + b):].to(torch.int32), b), None
        tokens, s, valid = self.match_lengths(context, lengths)
        return tokens, b - s, valid


class LZPenaltyLogitsProcessor(LogitsProcessor):
    r"""Hugging Face logits processor: ``scores[v] -= penalty * lz_penalty(v)`` (see :mod:`rpt.sampling.lz.definition`).

    Args:
        penalty: alpha >= 0 (paper default 0.15; 0 leaves the scores untouched).
        window, buffer: W and B (paper defaults 512 and 32).
        prompt_length: leading columns of ``input_ids`` kept out of the window: an int (the padded
            prompt width, so only generated tokens count, as the reference penalizer), or a LongTensor
            ``[batch]`` per row (e.g. just the left padding, to include the prompt). 0 = everything.
        vocab_size: V in ``log2 V``; defaults to the width of ``scores``. Ids >= the scores width
            are matched but never penalised (they cannot be sampled).
        inplace: modify ``scores`` in place (default): the penalty then costs O(batch x W) beyond
            the caller's own pass over the logits. Hugging Face ``generate`` hands processors a copy
            of the model's logits, so this is safe there, except that ``output_logits=True`` then
            records the penalised logits; pass ``inplace=False`` to leave the given tensor untouched
            (one ``[batch, V]`` copy per call).
        variant: ``"codelength"`` (default) or ``"closest_longest"`` (:mod:`rpt.sampling.lz.definition`): constructing
            this class with ``variant="closest_longest"`` gives a :class:`ClosestLongestLZLogitsProcessor`
            (a dense ``[batch, V]`` penalty); this class itself is the ``codelength`` transform.
        incremental: carry match lengths between calls
            (:class:`~rpt.sampling.lz.incremental.LZMatchTracker`) when the context grew by one token
            (ignored for a per-row ``prompt_length``; meant for CPU). Off by default: deciding
            whether a call extends the previous one reads the tokens on the host (a
            synchronisation every step, a graph break under ``torch.compile``), while the default
            from-scratch path has none, so it runs inside a compiled / CUDA-graph-captured step,
            and costs about 0.8x (random text) / 0.6x (repetitive) one elementwise pass over fresh
            logits at 1 thread, 1.2-1.5x / 0.9-1.3x at 2 threads (2.1-2.6x with
            OMP_WAIT_POLICY=PASSIVE: a thread wake-up per parallel op) (V = 128256, batch 8, quiet 2-core CPU,
            benchmarks/lz_penalty.py). ``None`` is accepted as ``False``.
    """

    variant = "codelength"

    def __new__(cls, *args, variant: str | None = None, **kwargs):
        if cls is LZPenaltyLogitsProcessor and variant is not None:  # the name picks the variant's class, as pathlib.Path its flavour
            check_variant(variant)
            cls = _PROCESSORS[variant]
        return super().__new__(cls)

    def __init__(
        self,
        penalty: float,
        window: int = 512,
        buffer: int = 32,
        prompt_length: int | torch.Tensor = 0,
        vocab_size: int | None = None,
        inplace: bool = True,
        incremental: bool | None = None,
        variant: str | None = None,
    ) -> None:
        if not isinstance(penalty, (int, float)) or not math.isfinite(penalty) or penalty < 0:
            raise ValueError(f"LZ penalty alpha={penalty!r} is invalid: use alpha >= 0 (paper default 0.15)")
        check_sizes(window, buffer)
        variant = variant or self.variant
        check_variant(variant)
        if variant != self.variant:
            raise ValueError(f"{type(self).__name__} is the {self.variant} variant; for {variant} use "
                             f"LZPenaltyLogitsProcessor(..., variant={variant!r})")
        if vocab_size is not None and vocab_size < 1:
            raise ValueError(f"vocab_size={vocab_size!r} is invalid: use None or an integer >= 1")
        self.matcher = LZMatcher(window, buffer, prompt_length, incremental)
        self.penalty, self.window, self.buffer = float(penalty), window, buffer
        self.vocab_size, self.inplace = vocab_size, inplace
        self._table_key: tuple | None = None

    @property
    def prompt_length(self) -> int | torch.Tensor:
        return self.matcher.prompt_length

    @property
    def incremental(self) -> bool | None:
        return self.matcher.incremental

    def _log_v(self, scores: torch.Tensor) -> float:
        return math.log2(self.vocab_size or scores.shape[-1])

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        context, lengths = self.matcher.context(input_ids)
        # (a compiled step's penalty is a tensor, never 0: rpt.sampling.processors' knobs)
        if (isinstance(self.penalty, float) and self.penalty == 0) or context.shape[1] == 0:
            return scores
        return self.apply(input_ids, context, lengths, scores if self.inplace else scores.clone())

    def apply(self, input_ids: torch.Tensor, context: torch.Tensor, lengths: torch.Tensor | None,
              scores: torch.Tensor) -> torch.Tensor:
        """Penalise ``scores`` in place for the window ``context``: here the ``codelength`` variant,
        each token's largest per-position penalty in one scatter-min
        (:func:`~rpt.sampling.lz.logits.apply_codelength`)."""
        tokens, depth, _ = self.matcher.depth(input_ids, context, lengths)
        table, base = self._penalty_table(self._log_v(scores), scores.device)
        return apply_codelength(scores, tokens, depth, table, base, self.window)

    def _penalty_table(self, log_v: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`~rpt.sampling.lz.logits.penalty_table`, cached."""
        if self._table_key != (log_v, device):
            self._table, self._base = penalty_table(self.penalty, self.window, self.buffer, log_v, device)
            self._table_key = (log_v, device)
        return self._table, self._base


class ClosestLongestLZLogitsProcessor(LZPenaltyLogitsProcessor):
    """The ``closest_longest`` LZ penalty (the later reference penalizer): not a per-position
    minimum, so subtracted densely (:func:`~rpt.sampling.lz.logits.apply_closest_longest`). Arguments
    and the matcher as :class:`LZPenaltyLogitsProcessor` (the ``codelength`` one), whose transform
    this one replaces."""

    variant = "closest_longest"

    def apply(self, input_ids, context, lengths, scores):
        tokens, s, valid = self.matcher.match_lengths(context, lengths)
        return apply_closest_longest(scores, tokens, s, valid, self.penalty, self.buffer, self._log_v(scores))


_PROCESSORS = {"codelength": LZPenaltyLogitsProcessor, "closest_longest": ClosestLongestLZLogitsProcessor}
