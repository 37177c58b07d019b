r"""Penalties and warpers as Hugging Face logits processors, built from a `SamplingConfig`.

Order (``build_logits_processors``), each step seeing the previous one's output:

1. token healing (optional, first so that truncation below only ranks tokens it allows);
2. penalties: repetition (CTRL form: :math:`\ell_v / r` if :math:`\ell_v > 0` else :math:`\ell_v r`,
   for every v in the context; Hugging Face's processor), frequency and presence (OpenAI form over
   generated tokens: :math:`\ell_v - f\,n_v - p\,[n_v > 0]`), LZ (:mod:`rpt.sampling.lz.definition`);
3. warpers: temperature, top-k, top-p, min-p (Hugging Face's), skipped when temperature == 0
   (greedy: the argmax of the penalised logits).

The RPT decoder's confidence test reads probabilities after the penalties and before temperature,
so ``build_logits_processors(..., include_warpers=False)`` returns the penalties alone.

``knobs`` (a compiled decode step's ``[len(TENSOR_KNOBS)]`` float64 tensor, :meth:`SamplingConfig.traced`):
each processor reads its value from it instead of the config's float, so that one graph serves every
value; the config then only says which processors exist.

Column conventions for ``input_ids [batch, T]``: ``prompt_length`` = leading columns that are prompt
(an int for a left-padded batch, or a LongTensor ``[batch]``); ``pad_length`` = leading columns that
are left padding (never counted by any penalty; default none).
"""

from __future__ import annotations

import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from rpt.sampling.config import TENSOR_KNOBS, SamplingConfig
from rpt.sampling.lz.processor import LZPenaltyLogitsProcessor

Columns = int | torch.Tensor


def _check_columns(name: str, value: Columns) -> None:
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or value.dtype.is_floating_point:
            raise ValueError(f"{name} tensor must be a 1-D integer tensor [batch]")
    elif not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name}={value!r} is invalid: use an int >= 0 or a [batch] LongTensor")


class FrequencyPresencePenaltyLogitsProcessor(LogitsProcessor):
    r"""OpenAI penalties over generated tokens: :math:`\ell_v \mathrel{-}= f\,n_v + p\,[n_v > 0]`.

    :math:`n_v` counts token v in ``input_ids[:, prompt_length:]`` (per row when ``prompt_length``
    is a ``[batch]`` tensor). Both penalties lie in [-2, 2]; negative values encourage repeats.
    Vectorised with one ``scatter_add`` per call; out of place.
    """

    def __init__(self, frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                 prompt_length: Columns = 0) -> None:
        for name, value in (("frequency_penalty", frequency_penalty), ("presence_penalty", presence_penalty)):
            if not isinstance(value, (int, float)) or not -2 <= value <= 2:
                raise ValueError(f"{name}={value!r} is invalid: use a value in [-2, 2]; 0 turns it off")
        _check_columns("prompt_length", prompt_length)
        self.frequency, self.presence = float(frequency_penalty), float(presence_penalty)
        self.prompt_length = prompt_length

    def counts(self, input_ids: torch.LongTensor, width: int) -> torch.Tensor:
        """``[batch, width]`` float counts of each token among the generated ones."""
        if isinstance(self.prompt_length, int):
            ids = input_ids[:, self.prompt_length:]
        else:
            start = self.prompt_length.to(input_ids.device)[:, None]
            cols = torch.arange(input_ids.shape[1], device=input_ids.device)
            ids = input_ids.masked_fill(cols < start, width)  # prompt columns land in the spare column
        # ids the logits cannot hold (embedding larger than the head) also go to the spare column
        ids = ids.clamp(0, width)
        counts = torch.zeros(ids.shape[0], width + 1, device=input_ids.device)
        counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=counts.dtype))
        return counts[:, :width]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if isinstance(self.frequency, float) and self.frequency == 0 and self.presence == 0:  # (tensors: knobs)
            return scores
        n = self.counts(input_ids, scores.shape[-1])
        delta = self.frequency * n + self.presence * (n > 0).to(n.dtype)
        return (scores.float() - delta).to(scores.dtype)


def _valued(proc, knobs: torch.Tensor | None, **attributes: str):
    """``proc`` with each ``attribute`` read from the knob it names in ``knobs`` (None: the float it was built
    with stays): Hugging Face's constructors take floats only, their ``__call__`` reads the attribute."""
    if knobs is not None:
        for attribute, name in attributes.items():
            setattr(proc, attribute, knobs[TENSOR_KNOBS.index(name)])
    return proc


def penalty_processors(config: SamplingConfig, prompt_length: Columns = 0, vocab_size: int | None = None,
                       pad_length: Columns | None = None, inplace: bool = True,
                       knobs: torch.Tensor | None = None) -> LogitsProcessorList:
    """The enabled penalties, in order repetition -> frequency/presence -> LZ.

    The LZ processor edits the logits it is given in place (Hugging Face ``generate`` and the RPT
    decoders pass logits nobody reuses); ``inplace=False`` keeps the caller's tensor, unless an earlier
    penalty already returned a fresh one.
    """
    _check_columns("prompt_length", prompt_length)
    if pad_length is not None:
        _check_columns("pad_length", pad_length)
    procs = LogitsProcessorList()
    if config.repetition_penalty != 1.0:
        # Whole context, as CTRL and HF do; left padding excluded when the caller says where it is.
        procs.append(_valued(RepetitionPenaltyLogitsProcessor(config.repetition_penalty, prompt_ignore_length=pad_length),
                             knobs, penalty="repetition_penalty"))
    if config.frequency_penalty != 0 or config.presence_penalty != 0:
        procs.append(_valued(FrequencyPresencePenaltyLogitsProcessor(
            config.frequency_penalty, config.presence_penalty, prompt_length), knobs,
            frequency="frequency_penalty", presence="presence_penalty"))
    if config.lz_penalty != 0:
        start = (0 if pad_length is None else pad_length) if config.lz_include_prompt else prompt_length
        procs.append(_valued(LZPenaltyLogitsProcessor(
            config.lz_penalty, config.lz_window, config.lz_buffer, prompt_length=start, vocab_size=vocab_size,
            inplace=inplace or len(procs) > 0, variant=config.lz_variant), knobs, penalty="lz_penalty"))
    return procs


def warper_processors(config: SamplingConfig, knobs: torch.Tensor | None = None) -> LogitsProcessorList:
    """Temperature -> top-k -> top-p -> min-p; empty when greedy (temperature 0)."""
    procs = LogitsProcessorList()
    if config.greedy:
        return procs
    if config.temperature != 1.0:
        procs.append(_valued(TemperatureLogitsWarper(config.temperature), knobs, temperature="temperature"))
    if config.top_k > 0:
        procs.append(TopKLogitsWarper(config.top_k))
    if config.top_p < 1.0:
        procs.append(_valued(TopPLogitsWarper(config.top_p), knobs, top_p="top_p"))
    if config.min_p > 0:
        procs.append(_valued(MinPLogitsWarper(config.min_p), knobs, min_p="min_p"))
    return procs


def caches_at_first_use(config: SamplingConfig) -> bool:
    """Whether a processor of ``config`` fills a module-level cache at its first use (the LZ penalty's
    cost tables, :func:`rpt.sampling.lz.definition.cost_table`): a compiled step must then run its proposals once
    eagerly before tracing them (a cache filled while tracing changes a global dynamo guards on)."""
    return config.lz_penalty != 0


def build_logits_processors(
    config: SamplingConfig,
    prompt_length: Columns = 0,
    vocab_size: int | None = None,
    *,
    include_warpers: bool = True,
    pad_length: Columns | None = None,
    healing: LogitsProcessor | None = None,
    inplace: bool = True,
    knobs: torch.Tensor | None = None,
) -> LogitsProcessorList:
    """Healing (if given) -> penalties -> (unless ``include_warpers=False``) warpers.

    Args:
        config: the sampling knobs.
        prompt_length: leading prompt columns of ``input_ids`` (int or ``[batch]``); frequency,
            presence and (unless ``lz_include_prompt``) LZ count only the columns after it.
        vocab_size: V for the LZ penalty's ``log2 V`` (default: the logits' width).
        include_warpers: False gives the post-penalty, pre-temperature distribution that the RPT
            confidence test reads.
        pad_length: leading left-padding columns per row, ignored by every penalty.
        healing: a :class:`~rpt.sampling.text.healing.TokenHealingLogitsProcessor`, applied first.
        inplace: the caller's logits may be overwritten (default; saves a ``[batch, V]`` copy in the
            LZ processor); pass False under ``generate(output_logits=True)`` to record raw logits.
        knobs: a compiled step's knob tensor (module docstring), or None.
    """
    procs = LogitsProcessorList([healing] if healing is not None else [])
    procs.extend(penalty_processors(config, prompt_length, vocab_size, pad_length, inplace=inplace or bool(procs),
                                    knobs=knobs))
    if include_warpers:
        procs.extend(warper_processors(config, knobs))
    return procs
