"""Sampling: the config, the RPT decoders, the LZ penalty, the standard penalties and warpers, token healing.

Modules: :mod:`~rpt.sampling.algorithm` (RPT stated once), :mod:`~rpt.sampling.decode.generate`
(``generate``: batched, on a KV cache, driven per row by :mod:`~rpt.sampling.decode.driver`; plain NTP
through :mod:`~rpt.sampling.decode.ntp_path`, all rows as tensors, the common steps of greedy RPT and
sampled k = 1 RPT through :mod:`~rpt.sampling.decode.rpt_path`; both steps functions of the
:mod:`~rpt.sampling.decode.state`, pooled for compiled decodes by :mod:`~rpt.sampling.decode.buffers`),
:mod:`~rpt.sampling.reference` (``generate_reference``: uncached, the oracle),
:mod:`~rpt.sampling.proposals` and :mod:`~rpt.sampling.randomness` (the proposal rules and
position-keyed draws both decoders share), :mod:`~rpt.sampling.prompts`, :mod:`~rpt.sampling.output`,
:mod:`~rpt.sampling.text.token_stream`, :mod:`~rpt.sampling.text.stopping`, :mod:`~rpt.sampling.text.complete` (prompts
in, texts out), the LZ penalty (:mod:`~rpt.sampling.lz.definition`, its definition), the processors and the
loaders.
"""

import importlib

# Each public name -> the module that defines it, imported on first use (PEP 562): importing
# rpt.sampling.flags or .config for a script's --help must not load torch and transformers (~3 s).
_WHERE = {
    "SamplingConfig": "config",
    "generate": "decode.generate",
    "HealedPrompt": "text.healing", "TokenHealingLogitsProcessor": "text.healing", "TokenVocabulary": "text.healing",
    "heal_prompt": "text.healing", "heal_prompts": "text.healing",
    "LZMatchTracker": "lz.incremental", "LZPenaltyLogitsProcessor": "lz.processor", "lz_match_costs": "lz.definition",
    "lz_match_lengths": "lz.definition", "lz_penalty": "lz.definition",
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
