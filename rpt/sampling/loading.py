"""Loading a checkpoint for sampling, and encoding its prompts.

Shared by ``sample.py`` and the evaluation scripts, so every entry point validates a checkpoint
and reports a bad one with the same message.
"""

from __future__ import annotations

import os

import torch

from rpt.checkpoint.model_ref import resolve_model_ref
from rpt.checkpoint.rpt_config import RPTConfig, check_rpt_objective, check_window_covers, read_rpt_config
from rpt.model.wrapper import RPT_CONFIG_NAME, RPTForCausalLM, load_causal_lm
from rpt.sampling.config import SamplingConfig
from rpt.sampling.text.chat import template_file_problem


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def load_tokenizer(checkpoint: str):
    """The checkpoint's tokenizer; a missing directory is a ``FileNotFoundError``."""
    from transformers import AutoTokenizer

    checkpoint = resolve_model_ref(checkpoint, "checkpoint", "train one first or check the path")
    try:
        return AutoTokenizer.from_pretrained(checkpoint)
    except Exception as e:  # a file transformers cannot read (KeyError, TypeError, UnicodeDecodeError, ...)
        problem = template_file_problem(os.path.expanduser(checkpoint)) or (
            _first_line(e) if isinstance(e, (OSError, ValueError)) else f"{type(e).__name__}: {_first_line(e)}")
        raise ValueError(f"cannot load a tokenizer from {checkpoint!r}: {problem}") from None


def read_checkpoint_config(checkpoint: str) -> RPTConfig | None:
    """The checkpoint's checked ``rpt_config.json`` (read before loading), or None for a plain causal LM."""
    return read_rpt_config(os.path.expanduser(checkpoint))


def rpt_window_of(checkpoint: str) -> int | None:
    """The trained window of an RPT checkpoint, or None for a plain causal LM (read before loading)."""
    config = read_checkpoint_config(checkpoint)
    return None if config is None else config.window


def check_checkpoint(window: int | RPTConfig | None, config: SamplingConfig, checkpoint: str) -> None:
    """RPT sampling needs an RPT checkpoint trained with the RPT objective whose trained window
    covers ``rpt_window``. ``window``: the checkpoint's :class:`RPTConfig` (or its trained window,
    then the record is read from ``checkpoint``); None for a plain causal LM."""
    if config.rpt_iters == 0:
        return
    if window is None:
        raise ValueError(f"{checkpoint} is not an RPT checkpoint (no {RPT_CONFIG_NAME}); --rpt-iters {config.rpt_iters} "
                         "needs a model fine-tuned with RPT. Use --rpt-iters 0 for plain next-token sampling")
    record = window if isinstance(window, RPTConfig) else read_checkpoint_config(checkpoint)
    trained = window.window if isinstance(window, RPTConfig) else int(window)
    check_window_covers(trained, config.rpt_window, checkpoint, name="--rpt-window")
    check_rpt_objective(record.objective if record is not None else None, config.rpt_iters, checkpoint, name="--rpt-iters")


def load_model(checkpoint: str, window: int | RPTConfig | None, device: str, dtype: torch.dtype):
    """The RPT model (or the plain causal LM, for NTP sampling: ``window`` None) in eval mode on ``device``.
    Both through :func:`rpt.model.wrapper.load_causal_lm`: ``.bin`` weights that weights-only unpickling refuses
    are one :class:`~rpt.checkpoint.directories.CheckpointError` naming the file, nothing of them run."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one clean stats line on stderr, no loading bars
    checkpoint = os.path.expanduser(checkpoint)
    try:
        if window is None:
            model = load_causal_lm(checkpoint, dtype=dtype)
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
