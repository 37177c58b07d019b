"""The inputs of a decode, checked: the model against the config, the prompts, the length budget."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from rpt.checkpoint.rpt_config import check_rpt_objective, check_window_covers
from rpt.model import RPTForCausalLM
from rpt.model.architectures import hf_model, position_refusal
from rpt.sampling.config import SamplingConfig
from rpt.sampling.text.healing import TokenVocabulary, heal_prompt


@dataclass
class Prompts:
    rows: list[list[int]]  # real prompt tokens per row (after healing)
    prefixes: list[bytes]  # bytes healing removed, per row (b"" when none)
    vocab: TokenVocabulary | None
    pads: list[int]  # left padding per row in the original layout
    width: int  # padded prompt width


def check_model(model, config: SamplingConfig) -> None:
    """An RPT model (or any causal LM for plain NTP) trained with RPT whose window covers ``rpt_window``."""
    if not isinstance(model, RPTForCausalLM):
        if config.rpt_iters > 0:
            raise ValueError(
                f"rpt_iters={config.rpt_iters} needs an RPTForCausalLM (a model trained with RPT); "
                f"got {type(model).__name__}. Use rpt_iters=0 for plain next-token sampling"
            )
        inner = hf_model(model)
        why = position_refusal(getattr(inner, "config", None), type(inner))
        if why is not None:  # its forward would take the decoder's position ids as something else, or not at all
            raise ValueError(f"{why}; this decoder addresses its KV cache by position ids, so it cannot decode it: "
                             "sample it with transformers' generate")
        return
    if config.rpt_iters > 0:
        check_window_covers(model.window, config.rpt_window, "the model")
        # a model whose objective is unknown (wrapped here, or loaded from an old checkpoint) decodes as asked
        check_rpt_objective(model.objective, config.rpt_iters, "the model", announce_unknown=False)


def rpt_iterations(model, config: SamplingConfig) -> int:
    """``k`` for this model: the config's, or 0 for a plain causal LM (NTP only)."""
    return config.rpt_iters if isinstance(model, RPTForCausalLM) else 0


def vocabulary_size(model) -> int | None:
    """The token ids ``model`` can embed: its input embedding's rows (None: no embedding to ask)."""
    base = getattr(model, "lm", model)
    get = getattr(base, "get_input_embeddings", None)
    embedding = get() if get is not None else None
    weight = getattr(embedding, "weight", None)
    return None if weight is None else int(weight.shape[0])


def check_token_ids(rows: list[list[int]], pads: list[int], vocab: int | None) -> None:
    """``ValueError`` (one line: where, which id, the vocabulary and the fix) for a prompt token id outside
    ``0 .. vocab - 1``: checked before any model call, eager or compiled, so that a bad id never reaches an
    embedding lookup (an ``IndexError``, or a compiled step's failure)."""
    if vocab is None:
        return
    for b, row in enumerate(rows):
        if row and (min(row) < 0 or max(row) >= vocab):
            j = next(j for j, t in enumerate(row) if not 0 <= t < vocab)
            raise ValueError(f"input_ids[{b}, {pads[b] + j}] = {row[j]} is outside the model's vocabulary of {vocab} "
                             f"ids (0 .. {vocab - 1}): tokenize with the model's own tokenizer (or resize its "
                             f"embeddings to the tokenizer's, model.resize_token_embeddings(len(tokenizer)))")


def _split_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple[list[list[int]], list[int]]:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype.is_floating_point:
        raise ValueError("input_ids must be an integer tensor [batch, length]")
    batch, width = input_ids.shape
    if batch == 0 or width == 0:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} is empty; give at least one prompt token per row")
    if attention_mask is None:
        mask = torch.ones_like(input_ids, dtype=torch.bool)
    else:
        if attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask {tuple(attention_mask.shape)} must match input_ids {tuple(input_ids.shape)}")
        mask = attention_mask.bool()
    mask_h, ids_h = mask.cpu(), input_ids.cpu()
    pads = (~mask_h).sum(1).tolist()
    rows = []
    for b in range(batch):
        if pads[b] == width:
            raise ValueError(f"prompt {b} is empty (attention_mask all zeros)")
        if not bool(mask_h[b, pads[b]:].all()):
            raise ValueError("prompts must be left-padded (attention_mask 0...0 1...1 in every row): set "
                             "tokenizer.padding_side = \"left\" (or pass padding_side=\"left\") before tokenizing")
        rows.append(ids_h[b, pads[b]:].tolist())
    return rows, pads


def prepare_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, config: SamplingConfig,
                    tokenizer=None, vocab_size: int | None = None) -> Prompts:
    """Split a left-padded batch into per-row prompts (their ids checked against ``vocab_size``:
    :func:`check_token_ids`) and apply token healing if configured."""
    rows, pads = _split_rows(input_ids, attention_mask)
    check_token_ids(rows, pads, vocab_size)
    width = input_ids.shape[1]
    prefixes, vocab = [b""] * len(rows), None
    if config.token_healing:
        if tokenizer is None:
            raise ValueError("token_healing needs the tokenizer; pass tokenizer=...")
        vocab = TokenVocabulary.from_tokenizer(tokenizer)
        healed = [heal_prompt(vocab, r) for r in rows]
        rows, prefixes = [h.input_ids for h in healed], [h.prefix for h in healed]
        width = max(len(r) for r in rows)
        pads = [width - len(r) for r in rows]
    return Prompts(rows, prefixes, vocab, pads, width)


def context_limit(model) -> int | None:
    return getattr(model.config, "max_position_embeddings", None)


def row_budgets(model, prompts: Prompts, config: SamplingConfig) -> list[int]:
    """Each row's ``max_new_tokens``, shortened (with a warning naming the rows) where the row would run
    past the model's context: a row's budget depends on its own prompt only, never on its neighbours."""
    limit = context_limit(model)
    lengths = [len(r) for r in prompts.rows]
    if limit is None:
        return [config.max_new_tokens] * len(lengths)
    if max(lengths) >= limit:
        raise ValueError(
            f"a prompt has {max(lengths)} tokens but the model's context is {limit} (max_position_embeddings); "
            "shorten the prompt"
        )
    budgets = [min(config.max_new_tokens, limit - n) for n in lengths]
    short = [b for b, budget in enumerate(budgets) if budget < config.max_new_tokens]
    if short:
        warnings.warn(f"max_new_tokens={config.max_new_tokens} would run past the model's context of {limit} "
                      f"tokens; rows {short} generate at most {[budgets[b] for b in short]}",
                      stacklevel=5)  # the caller of generate / generate_reference: past prepare_decode and no_grad
    return budgets


def pad_token_id(model, config: SamplingConfig) -> int:
    """The id fed in padding columns (always masked) and written after a finished row's end: the
    model's pad id, else the first EOS id, else 0; one the embedding holds (a default config's EOS
    may lie outside a small vocabulary)."""
    vocab = getattr(model.config, "vocab_size", None)
    for pad in (getattr(model.config, "pad_token_id", None), *config.eos_token_ids[:1]):
        if pad is not None and (vocab is None or 0 <= int(pad) < vocab):
            return int(pad)
    return 0
