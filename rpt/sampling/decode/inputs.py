"""The input preparation both decoders share: the config validated and its EOS ids completed, the model
checked against it, the prompts split (and healed), each row's budget, the shared plan and row seeds.

Only the inputs are shared: :func:`rpt.sampling.decode.generate.generate` and its oracle
:func:`rpt.sampling.reference.generate_reference` drive the algorithm each in its own way from here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rpt.sampling import randomness
from rpt.sampling.algorithm import Plan
from rpt.sampling.config import SamplingConfig
from rpt.sampling.prompts import (
    Prompts,
    check_model,
    pad_token_id,
    prepare_prompts,
    row_budgets,
    rpt_iterations,
    vocabulary_size,
)
from rpt.sampling.text.stopping import StopChecker
from rpt.sampling.text.token_stream import check_streamer


@dataclass(frozen=True)
class DecodeInputs:
    config: SamplingConfig  # validated, with the model's and the tokenizer's EOS ids where it named none
    prompts: Prompts
    budgets: list[int]  # each row's max_new_tokens, within the model's context
    plan: Plan  # plan.k: the RPT iterations this model runs (0 for a plain causal LM)
    seeds: list[int]  # one per row, keying its draws
    pad_id: int


def prepare_decode(model, config: SamplingConfig, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                   tokenizer, streamer, row_seeds: list[int] | None) -> DecodeInputs:
    """Check and prepare a decode's inputs (``ValueError`` on a bad one), in the order a user meets the
    errors: the config, the model, the prompts (their token ids inside the model's vocabulary), the
    streamer, the budgets, the row seeds."""
    config.validate()
    config = config.with_default_eos(model, tokenizer)
    check_model(model, config)
    prompts = prepare_prompts(input_ids, attention_mask, config, tokenizer, vocabulary_size(model))
    check_streamer(streamer, len(prompts.rows))
    budgets = row_budgets(model, prompts, config)
    plan = Plan(k=rpt_iterations(model, config), w=config.rpt_window, max_new=max(budgets),
                deterministic=config.deterministic,
                stopper=StopChecker(config.eos_token_ids, config.stop, tokenizer, window=config.rpt_window))
    seeds = randomness.row_seeds(config.seed, len(prompts.rows), row_seeds)
    return DecodeInputs(config, prompts, budgets, plan, seeds, pad_token_id(model, config))
