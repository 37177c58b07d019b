r"""What both RPT decoders share: prompt preparation, the proposal rules, the output object.

Proposal rules (issue 5), for logits ``z`` of a query and the processors of its position:

* NTP proposes ``x_t`` from ``warpers(penalties(z))``: the argmax when ``temperature == 0``, else a
  sample;
* PTP proposes ``x_j`` from ``q = penalties_j(z)`` (the penalties NTP had at position j, i.e. computed
  on ``x_{<j}``, when ``penalize_ptp``; none otherwise): the argmax of ``q`` with ``ptp_greedy`` (or
  greedy NTP), else a sample from ``warpers(q)``. It is accepted iff ``softmax(q)[proposal] >
  confidence`` (temperature 1, before truncation).

Token healing is a hard constraint, not a penalty: it applies to PTP proposals whatever
``penalize_ptp`` says, and the tokens generated while it is active are never revisited (so a
correction can never break the re-spelled prompt text).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from rpt.model import RPTForCausalLM
from rpt.sampling.config import SamplingConfig
from rpt.sampling.healing import TokenVocabulary, heal_prompt
from rpt.sampling.processors import build_logits_processors, penalty_processors, warper_processors


@dataclass
class GenerateOutput:
    """Result of :func:`generate` / :func:`generate_reference`.

    ``sequences`` is ``[batch, prompt_width + new]``: each prompt left-padded to ``prompt_width``
    (the given ``input_ids`` unchanged unless token healing backed prompts up), then the generated
    tokens, then ``pad_token_id`` after a row finished. ``stats``: ``new_tokens`` (summed over rows),
    ``forward_passes`` (model calls), ``corrections`` (accepted PTP replacements that changed a
    token), ``tokens_per_s``, ``seconds``, ``calls_per_token``.
    """

    sequences: torch.Tensor
    stats: dict[str, float]
    prompt_width: int
    prompt_lengths: list[int]
    new_token_counts: list[int]
    finish_reasons: list[str]  # "eos", "stop" or "length" per row
    healing_prefixes: list[bytes] = field(default_factory=list)

    def generated(self, row: int) -> list[int]:
        """The generated tokens of ``row`` (no padding)."""
        n = self.new_token_counts[row]
        return self.sequences[row, self.prompt_width: self.prompt_width + n].tolist()


@dataclass
class Prompts:
    rows: list[list[int]]  # real prompt tokens per row (after healing)
    prefixes: list[bytes]  # bytes healing removed, per row (b"" when none)
    vocab: TokenVocabulary | None
    pads: list[int]  # left padding per row in the original layout
    width: int  # padded prompt width


def check_model(model, config: SamplingConfig) -> None:
    """An RPT model (or any causal LM for plain NTP) whose trained window covers ``rpt_window``."""
    if not isinstance(model, RPTForCausalLM):
        if config.rpt_iters > 0:
            raise ValueError(
                f"rpt_iters={config.rpt_iters} needs an RPTForCausalLM (a model trained with RPT); "
                f"got {type(model).__name__}. Use rpt_iters=0 for plain next-token sampling"
            )
        return
    if config.rpt_iters > 0 and config.rpt_window > model.window:
        raise ValueError(
            f"rpt_window={config.rpt_window} is larger than the window {model.window} the model was trained with; "
            f"use rpt_window <= {model.window}"
        )


def prepare_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, config: SamplingConfig,
                    tokenizer=None) -> Prompts:
    """Split a left-padded batch into per-row prompts and apply token healing if configured."""
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
            raise ValueError("prompts must be left-padded: attention_mask must be 0...0 1...1 in every row")
        rows.append(ids_h[b, pads[b]:].tolist())
    prefixes, vocab = [b""] * batch, None
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


def effective_max_new_tokens(model, prompts: Prompts, config: SamplingConfig) -> int:
    """``max_new_tokens``, shortened (with a warning) so no row runs past the model's context."""
    limit = context_limit(model)
    longest = max(len(r) for r in prompts.rows)
    if limit is None:
        return config.max_new_tokens
    if longest >= limit:
        raise ValueError(
            f"a prompt has {longest} tokens but the model's context is {limit} (max_position_embeddings); "
            "shorten the prompt"
        )
    if longest + config.max_new_tokens > limit:
        warnings.warn(f"max_new_tokens={config.max_new_tokens} would run past the model's context of {limit} "
                      f"tokens; generating at most {limit - longest}", stacklevel=3)
        return limit - longest
    return config.max_new_tokens


def pad_token_id(model, config: SamplingConfig) -> int:
    pad = getattr(model.config, "pad_token_id", None)
    if pad is None:
        pad = config.eos_token_ids[0] if config.eos_token_ids else 0
    return int(pad)


def make_generator(config: SamplingConfig, device: torch.device) -> torch.Generator | None:
    if config.seed is None:
        return None
    return torch.Generator(device=device).manual_seed(int(config.seed))


class Proposer:
    """The NTP and PTP proposal rules of the module docstring, batched over rows."""

    def __init__(self, config: SamplingConfig, prompt_length, pad_length=None,
                 healing: LogitsProcessor | None = None, generator: torch.Generator | None = None):
        self.config, self.generator = config, generator
        self.ntp_procs = build_logits_processors(config, prompt_length, pad_length=pad_length, healing=healing)
        penalties = penalty_processors(config, prompt_length, pad_length=pad_length) if config.penalize_ptp else []
        self.ptp_procs = LogitsProcessorList(([healing] if healing is not None else []) + list(penalties))
        self.warpers = warper_processors(config)
        self.ptp_samples_greedy = config.ptp_greedy or config.greedy

    def ntp(self, context: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """``[B]`` proposals for the token after ``context`` (``[B, T]``) from its logits ``[B, V]``."""
        scores = self.ntp_procs(context, logits) if self.ntp_procs else logits
        if self.config.greedy:
            return scores.argmax(-1)
        probs = torch.softmax(scores.float(), dim=-1)
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)

    def ptp(self, context: torch.Tensor, logits: torch.Tensor, samples: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens, accepted)``, each ``[B, samples]``, for x_j with ``context = x_{<j}``."""
        scores = self.ptp_procs(context, logits) if self.ptp_procs else logits
        probs = torch.softmax(scores.float(), dim=-1)
        if self.ptp_samples_greedy:  # the argmax and its probability in one reduction
            top, tokens = probs.max(-1, keepdim=True)
            accepted = top > self.config.confidence
            if samples == 1:
                return tokens, accepted
            return tokens.expand(-1, samples), accepted.expand(-1, samples)
        else:
            warped = torch.softmax(self.warpers(context, scores).float(), dim=-1)
            tokens = torch.multinomial(warped, samples, replacement=True, generator=self.generator)
        return tokens, probs.gather(-1, tokens) > self.config.confidence


class HealingFrontier:
    """How many leading generated tokens of a row healing froze (None while still re-spelling)."""

    def __init__(self, vocab: TokenVocabulary | None, prefix: bytes):
        self.vocab, self.prefix = vocab, prefix
        self.free_from: int | None = 0 if not prefix else None

    def update(self, generated: list[int]) -> None:
        """Call after each settled position; frozen tokens never change, so this is final once set."""
        if self.free_from is None:
            spelled = self.vocab.decode(generated)
            if spelled is None or len(spelled) >= len(self.prefix):
                self.free_from = len(generated)

    def first_revisable(self, generated_so_far: int) -> int:
        return generated_so_far if self.free_from is None else self.free_from


def assemble(input_ids: torch.Tensor, prompts: Prompts, generated: list[list[int]], reasons: list[str],
             pad_id: int, stats: dict, start: float, healed: bool) -> GenerateOutput:
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
                          [len(g) for g in generated], reasons, list(prompts.prefixes))


class FrozenStream:
    """Feeds a streamer (``put`` / ``end``, Hugging Face protocol) the tokens RPT can no longer change."""

    def __init__(self, streamer, prompt: list[int], config: SamplingConfig):
        self.streamer, self.sent = streamer, 0
        # the next window revisits the newest w - 1 tokens; everything before them is final
        self.lag = config.rpt_window - 1 if config.rpt_iters > 0 else 0
        if streamer is not None:
            streamer.put(torch.tensor(prompt, dtype=torch.long))

    def update(self, generated: list[int], final: bool = False) -> None:
        if self.streamer is None:
            return
        frozen = len(generated) if final else max(len(generated) - self.lag, 0)
        if frozen > self.sent:
            self.streamer.put(torch.tensor(generated[self.sent:frozen], dtype=torch.long))
            self.sent = frozen

    def end(self, generated: list[int]) -> None:
        if self.streamer is not None:
            self.update(generated, final=True)
            self.streamer.end()


def check_streamer(streamer, batch: int) -> None:
    if streamer is not None and batch != 1:
        raise ValueError(f"streaming needs a single prompt, got a batch of {batch}")
