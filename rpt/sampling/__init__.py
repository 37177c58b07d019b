"""Sampling: the config, the RPT decoders, the LZ penalty, the standard penalties and warpers, token healing.

Modules: :mod:`~rpt.sampling.algorithm` (RPT stated once), :mod:`~rpt.sampling.fast_decoder`
(``generate``: batched, on a KV cache, driven per row by :mod:`~rpt.sampling.decoder`; plain NTP
through :mod:`~rpt.sampling.ntp_path`, all rows as tensors, the common steps of greedy RPT and
sampled k = 1 RPT through :mod:`~rpt.sampling.rpt_path`; both steps functions of the
:mod:`~rpt.sampling.decode_state`, pooled for compiled decodes by :mod:`~rpt.sampling.decode_buffers`),
:mod:`~rpt.sampling.reference` (``generate_reference``: uncached, the oracle),
:mod:`~rpt.sampling.proposals` and :mod:`~rpt.sampling.randomness` (the proposal rules and
position-keyed draws both decoders share), :mod:`~rpt.sampling.prompts`, :mod:`~rpt.sampling.output`,
:mod:`~rpt.sampling.streaming`, :mod:`~rpt.sampling.stopping`, :mod:`~rpt.sampling.texts` (prompts
in, texts out), the LZ penalty (:mod:`~rpt.sampling.lz`, its definition), the processors and the
loaders.
"""

import importlib

# Each public name -> the module that defines it, imported on first use (PEP 562): importing
# rpt.sampling.cli or .config for a script's --help must not load torch and transformers (~3 s).
_WHERE = {
    "SamplingConfig": "config",
    "generate": "fast_decoder",
    "HealedPrompt": "healing", "TokenHealingLogitsProcessor": "healing", "TokenVocabulary": "healing",
    "heal_prompt": "healing", "heal_prompts": "healing",
    "LZMatchTracker": "lz_incremental", "LZPenaltyLogitsProcessor": "lz_processor", "lz_match_costs": "lz",
    "lz_match_lengths": "lz", "lz_penalty": "lz",
    "GenerateOutput": "output",
    "FrequencyPresencePenaltyLogitsProcessor": "processors", "build_logits_processors": "processors",
    "penalty_processors": "processors", "warper_processors": "processors",
    "generate_reference": "reference",
}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


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


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
