"""Prompts in, completion texts out: the one generation helper of ``sample.py``, the evaluation
scripts (through :func:`rpt.evaluation.batched_generation.generate_texts`) and the repetition study.

It left-pads each batch, runs a decoder, and decodes every row back to the text after its prompt
(cut at the first stop string; token healing's re-spelled prompt end is not repeated). Row seeds
follow the prompt's index in the whole list (a hash of ``(config.seed, i)``), so the text of a prompt does
not depend on the batch size or on which other prompts share its batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rpt.sampling import randomness
from rpt.sampling.config import SamplingConfig
from rpt.sampling.decode.generate import generate
from rpt.sampling.text.stopping import truncate_at_stop


@dataclass
class Completion:
    """One prompt's result: ``text`` (after the prompt, cut at the first stop string), the prompt's
    tokens, the generated tokens, the finish reason, its row seed, the stats of its batch (the same
    dict object for every row of a batch) and the decode that made it (:func:`decode_path`)."""

    text: str
    prompt_ids: list[int]
    new_ids: list[int]
    finish_reason: str
    seed: int
    stats: dict
    path: str = "eager"


def decode_path(compile, stats: dict) -> str:
    """Which decode made a batch: ``"compiled"``, ``"eager"``, or ``"fallback"`` (compiled was asked, and the
    decode ran eagerly after a compile failure: ``stats["compile_fallback"]``, :mod:`rpt.decode_forward.compile_guard`).
    In float32 the three give the same tokens in every test here; in bf16 a kernel may move a near tie,
    so stored completions record it (an evaluation resumed with another ``--compile`` does not reuse them)."""
    if not compile:
        return "eager"
    return "fallback" if "compile_fallback" in stats else "compiled"


def left_pad(rows: Sequence[Sequence[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` ``[batch, longest]`` with each row right-aligned."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, width - len(r):] = torch.tensor(list(r), dtype=torch.long)
        mask[b, width - len(r):] = 1
    return ids.to(device), mask.to(device)


def pad_id_of(tokenizer) -> int:
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    return int(tokenizer.eos_token_id or 0)


def completion_text(tokenizer, prompt_ids: list[int], fed_ids: list[int], generated: list[int], stop: list[str]) -> str:
    """The text after the prompt, cut at the first stop string.

    ``fed_ids`` is the prompt as decoded from (shorter than ``prompt_ids`` when token healing removed
    its end, which the generated tokens then re-spell), so the prompt is cut off by its text.
    """
    prompt_text = tokenizer.decode(prompt_ids, skip_special_tokens=True)
    full = tokenizer.decode(list(fed_ids) + list(generated), skip_special_tokens=True)
    text = full[len(prompt_text):] if full.startswith(prompt_text) else tokenizer.decode(generated, skip_special_tokens=True)
    return truncate_at_stop(text, stop)


def complete(model, tokenizer, prompt_ids: Sequence[Sequence[int]], config: SamplingConfig, *, batch_size: int = 8,
             decode: Callable | None = None, row_seeds: Sequence[int] | None = None, streamer=None,
             on_batch: Callable[[int], None] | None = None, compile: bool = False) -> list[Completion]:
    """Decode ``prompt_ids`` in batches of ``batch_size`` and turn every row back into text.

    Args:
        decode: :func:`~rpt.sampling.generate` (default) or :func:`~rpt.sampling.generate_reference`.
        row_seeds: one seed per prompt (default ``row_seed(config.seed, i)``, i the prompt's index here).
        streamer: for a single prompt, a streamer receiving its tokens as they become final.
        on_batch: called with the number of prompts of each finished batch.
        compile: ``torch.compile`` the model step (:func:`~rpt.sampling.generate` only; a string names the
            backend).
    """
    decode = decode or generate
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} is invalid: use an integer >= 1")
    seeds = randomness.row_seeds(config.seed, len(prompt_ids), row_seeds)
    device = next(model.parameters()).device
    extra = {"compile": compile} if compile else {}
    out: list[Completion] = []
    for start in range(0, len(prompt_ids), batch_size):
        batch = [list(p) for p in prompt_ids[start: start + batch_size]]
        ids, mask = left_pad(batch, pad_id_of(tokenizer), device)
        result = decode(model, ids, config, mask, tokenizer=tokenizer, streamer=streamer,
                        row_seeds=seeds[start: start + len(batch)], **extra)
        stats = dict(result.stats)  # one dict per batch, shared by its rows
        path = decode_path(compile, stats)
        for b, prompt in enumerate(batch):
            new = result.generated(b)
            out.append(Completion(completion_text(tokenizer, prompt, result.fed_prompt(b), new, config.stop), prompt,
                                  new, result.finish_reasons[b], result.row_seeds[b], stats, path))
        if on_batch is not None:
            on_batch(len(batch))
    return out
