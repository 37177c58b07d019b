"""Sampling: the config, the RPT decoders, the LZ penalty, the standard penalties and warpers, token healing.

Modules: :mod:`~rpt.sampling.algorithm` (RPT stated once), :mod:`~rpt.sampling.fast_decoder`
(``generate``: batched, on a KV cache; plain NTP through :mod:`~rpt.sampling.ntp_path`, all rows as
tensors, the common steps of greedy RPT and sampled k = 1 RPT through :mod:`~rpt.sampling.rpt_path`;
both steps functions of the :mod:`~rpt.sampling.decode_state`, pooled for compiled decodes by
:mod:`~rpt.sampling.decode_buffers`), :mod:`~rpt.sampling.reference` (``generate_reference``:
uncached, the oracle), :mod:`~rpt.sampling.proposals` and :mod:`~rpt.sampling.randomness` (the
proposal rules and position-keyed draws both decoders share), :mod:`~rpt.sampling.prompts`,
:mod:`~rpt.sampling.output`, :mod:`~rpt.sampling.streaming`, :mod:`~rpt.sampling.stopping`,
:mod:`~rpt.sampling.texts` (prompts in, texts out), the processors and the loaders.
"""

from rpt.sampling.config import SamplingConfig
from rpt.sampling.fast_decoder import generate
from rpt.sampling.healing import (
    HealedPrompt,
    TokenHealingLogitsProcessor,
    TokenVocabulary,
    heal_prompt,
    heal_prompts,
)
from rpt.sampling.lz import (
    LZMatchTracker,
    LZPenaltyLogitsProcessor,
    lz_match_costs,
    lz_match_lengths,
    lz_penalty,
)
from rpt.sampling.output import GenerateOutput
from rpt.sampling.processors import (
    FrequencyPresencePenaltyLogitsProcessor,
    build_logits_processors,
    penalty_processors,
    warper_processors,
)
from rpt.sampling.reference import generate_reference

__all__ = [
    "GenerateOutput",
    "generate",
    "generate_reference",
    "FrequencyPresencePenaltyLogitsProcessor",
    "HealedPrompt",
    "LZMatchTracker",
    "LZPenaltyLogitsProcessor",
    "SamplingConfig",
    "TokenHealingLogitsProcessor",
    "TokenVocabulary",
    "build_logits_processors",
    "heal_prompt",
    "heal_prompts",
    "lz_match_costs",
    "lz_match_lengths",
    "lz_penalty",
    "penalty_processors",
    "warper_processors",
]
