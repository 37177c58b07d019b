"""What a decode returns: the padded sequences, per-row lengths and reasons, and the stats."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from rpt.sampling.prompts import Prompts


@dataclass
class GenerateOutput:
    """Result of :func:`~rpt.sampling.generate` / :func:`~rpt.sampling.generate_reference`.

    ``sequences`` is ``[batch, prompt_width + new]``: each prompt left-padded to ``prompt_width``
    (the given ``input_ids`` unchanged unless token healing backed prompts up), then the generated
    tokens, then ``pad_token_id`` after a row finished. ``stats``: ``new_tokens`` (summed over rows),
    ``forward_passes`` (model calls), ``corrections`` (accepted PTP replacements that changed a
    token), ``tokens_per_s``, ``seconds``, ``calls_per_token``. ``row_seeds``: the seed each row's
    draws were keyed by (rerun one row alone with ``row_seeds=[s]`` to reproduce it).
    """

    sequences: torch.Tensor
    stats: dict[str, float]
    prompt_width: int
    prompt_lengths: list[int]
    new_token_counts: list[int]
    finish_reasons: list[str]  # "eos", "stop" or "length" per row
    healing_prefixes: list[bytes] = field(default_factory=list)
    row_seeds: list[int] = field(default_factory=list)

    def generated(self, row: int) -> list[int]:
        """The generated tokens of ``row`` (no padding)."""
        n = self.new_token_counts[row]
        return self.sequences[row, self.prompt_width: self.prompt_width + n].tolist()

    def fed_prompt(self, row: int) -> list[int]:
        """The prompt tokens ``row`` was decoded from (shorter than given when token healing backed it up)."""
        return self.sequences[row, self.prompt_width - self.prompt_lengths[row]: self.prompt_width].tolist()


def assemble(input_ids: torch.Tensor, prompts: Prompts, generated: list[list[int]], reasons: list[str],
             pad_id: int, stats: dict, start: float, healed: bool, seeds: list[int]) -> GenerateOutput:
    """Stack prompts and generated tokens into the padded ``sequences`` and finish the stats."""
    batch, width = len(prompts.rows), prompts.width
    longest = max((len(g) for g in generated), default=0)
    seq = torch.full((batch, width + longest), pad_id, dtype=torch.long)
    for b, (p, g) in enumerate(zip(prompts.rows, generated)):
        seq[b, width - len(p): width] = torch.tensor(p, dtype=torch.long)
        if g:
            seq[b, width: width + len(g)] = torch.tensor(g, dtype=torch.long)
    if not healed:  # keep the caller's prompt columns (padding values included) byte for byte
        seq[:, :width] = input_ids.cpu()
    seconds = max(time.perf_counter() - start, 1e-9)
    new = sum(len(g) for g in generated)
    stats = dict(stats)
    stats.update(new_tokens=new, seconds=seconds, tokens_per_s=new / seconds,
                 calls_per_token=stats["forward_passes"] / max(new, 1))
    return GenerateOutput(seq.to(input_ids.device), stats, width, [len(p) for p in prompts.rows],
                          [len(g) for g in generated], reasons, list(prompts.prefixes), list(seeds))
