"""Loading a checkpoint for sampling, and encoding its prompts.

Shared by ``sample.py`` and the evaluation scripts, so every entry point validates a checkpoint
and reports a bad one with the same message.
"""

from __future__ import annotations

import json
import os

import torch

from rpt.model import RPT_CONFIG_NAME, RPTForCausalLM
from rpt.sampling.config import SamplingConfig


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def load_tokenizer(checkpoint: str):
    """The checkpoint's tokenizer; a missing directory is a ``FileNotFoundError``."""
    from transformers import AutoTokenizer

    from rpt.model_ref import resolve_model_ref

    checkpoint = resolve_model_ref(checkpoint, "checkpoint", "train one first or check the path")
    try:
        return AutoTokenizer.from_pretrained(checkpoint)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot load a tokenizer from {checkpoint!r}: {_first_line(e)}") from None


def rpt_window_of(checkpoint: str) -> int | None:
    """The trained window of an RPT checkpoint, or None for a plain causal LM (read before loading)."""
    from transformers.utils import cached_file

    path = cached_file(os.path.expanduser(checkpoint), RPT_CONFIG_NAME, _raise_exceptions_for_missing_entries=False,
                       _raise_exceptions_for_connection_errors=False)
    if path is None:
        return None
    with open(path) as f:
        return int(json.load(f)["window"])


def check_checkpoint(window: int | None, config: SamplingConfig, checkpoint: str) -> None:
    """RPT sampling needs an RPT checkpoint whose trained window covers ``rpt_window``."""
    if config.rpt_iters == 0:
        return
    if window is None:
        raise ValueError(f"{checkpoint} is not an RPT checkpoint (no {RPT_CONFIG_NAME}); --rpt-iters {config.rpt_iters} "
                         "needs a model fine-tuned with RPT. Use --rpt-iters 0 for plain next-token sampling")
    if config.rpt_window > window:
        raise ValueError(f"--rpt-window {config.rpt_window} is larger than the window {window} that {checkpoint} "
                         f"was trained with; use --rpt-window {window} or less")


def load_model(checkpoint: str, window: int | None, device: str, dtype: torch.dtype):
    """The RPT model (or the plain causal LM, for NTP sampling) in eval mode on ``device``."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one clean stats line on stderr, no loading bars
    checkpoint = os.path.expanduser(checkpoint)
    try:
        if window is None:
            model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype)
        else:
            model = RPTForCausalLM.from_pretrained(checkpoint, dtype=dtype)
    except OSError as e:
        raise ValueError(f"cannot load {checkpoint!r}: {_first_line(e)}") from None
    return model.to(device).eval()


def encode(tokenizer, records: list[dict], model, fix: str = "shorten it") -> list[list[int]]:
    """Token ids of each record's ``prompt``; ``ValueError`` for an empty one or one that fills the
    model's context (``fix`` says what to do, e.g. a benchmark's "use fewer --shots")."""
    limit = getattr(model.config, "max_position_embeddings", None)
    out = []
    for rec in records:
        ids = tokenizer(rec["prompt"])["input_ids"]
        if not ids:
            raise ValueError(f"prompt {rec['id']!r} is empty after tokenization")
        if limit is not None and len(ids) >= limit:
            raise ValueError(f"prompt {rec['id']!r} has {len(ids)} tokens but the model's context is {limit} "
                             f"tokens (max_position_embeddings); {fix}")
        out.append(ids)
    return out
