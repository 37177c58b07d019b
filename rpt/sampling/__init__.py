"""Sampling: the config, the LZ penalty, the standard penalties and warpers, token healing."""

from rpt.sampling.common import GenerateOutput
from rpt.sampling.config import SamplingConfig
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
from rpt.sampling.processors import (
    FrequencyPresencePenaltyLogitsProcessor,
    build_logits_processors,
    penalty_processors,
    warper_processors,
)
from rpt.sampling.reference import generate_reference
from rpt.sampling.rpt import generate

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
