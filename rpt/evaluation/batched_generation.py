"""Model-side helpers shared by the evaluation scripts: load a checkpoint, sample a list of
prompts in batches, split the work across processes under ``accelerate launch``."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import torch

from rpt.cli.devices import resolve_dtype
from rpt.sampling.config import SamplingConfig
from rpt.sampling.loading import load_model, load_tokenizer, rpt_window_of
from rpt.sampling.text.complete import complete


def load_checkpoint(checkpoint: str, device: str = "cpu", dtype: str = "float32"):
    """``(model, tokenizer, trained_window)``; ``trained_window`` is None for a plain causal LM;
    ``dtype`` one of :data:`~rpt.cli.devices.DTYPE_CHOICES`."""
    tokenizer = load_tokenizer(checkpoint)
    window = rpt_window_of(checkpoint)
    model = load_model(checkpoint, window, device, resolve_dtype(dtype, device))
    return model, tokenizer, window


def check_source_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The checks shared by the scripts that either generate (``--checkpoint``) or score given
    ``--completions``: exactly one source, ``--limit >= 1``, ``--batch-size >= 1``."""
    if (args.checkpoint is None) == (args.completions is None):
        parser.error("give exactly one of --checkpoint (generate with a model) and --completions (score given ones)")
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be >= 1")
    if args.batch_size < 1:
        parser.error("--batch-size must be >= 1")


def generate_texts(
    model, tokenizer, prompts: Sequence[str], config: SamplingConfig, batch_size: int = 8,
    on_batch: Callable[[int], None] | None = None, *, row_seeds: Sequence[int] | None = None, compile: bool = False,
) -> list[dict]:
    """Continuations of ``prompts``: per prompt ``text`` (cut at ``config.stop``), ``prompt_ids``,
    ``new_ids``, ``finish_reason``, ``seed``, ``path`` (the decode that made it: ``compiled``, ``eager`` or
    ``fallback``, :func:`rpt.sampling.text.complete.decode_path`); plus the batch's decoding stats under ``stats``.

    Prompt i's draws are keyed by ``row_seed(config.seed, i)`` (or ``row_seeds[i]``): its text does not depend
    on ``batch_size``, and repeated prompts give different samples (:mod:`rpt.sampling.text.complete`).
    ``compile``: decode with ``generate(compile=True)`` (:func:`rpt.sampling.generate`).
    """
    encoded = [tokenizer(p)["input_ids"] for p in prompts]
    done = complete(model, tokenizer, encoded, config, batch_size=batch_size, row_seeds=row_seeds, on_batch=on_batch,
                    compile=compile)
    return [{"text": c.text, "prompt_ids": c.prompt_ids, "new_ids": c.new_ids, "finish_reason": c.finish_reason,
             "seed": c.seed, "stats": dict(c.stats), "path": c.path} for c in done]


def process_state():
    """accelerate's process state (a singleton: the first call decides it for the whole run).

    Without an accelerator device accelerate forms a multi-process (gloo) group only when told it
    runs on the CPU, as in ``rpt.training``; otherwise each CPU worker would do all the work alone.
    """
    from accelerate import PartialState

    return PartialState(cpu=not torch.accelerator.is_available())


def split_across_processes(items: list) -> tuple[list, Callable[[list], list]]:
    """This process's share of ``items`` and a function gathering every share back in order.

    Under ``accelerate launch`` each process takes a contiguous slice; alone it takes all.
    """
    from accelerate.utils import gather_object

    state = process_state()
    if state.num_processes == 1:
        return items, lambda results: results
    with state.split_between_processes(list(range(len(items)))) as mine:
        share = [items[i] for i in mine]

    def gather(results: list) -> list:
        return gather_object([results])  # list of per-process lists, in process order

    def flat(results: list) -> list:
        return [r for part in gather(results) for r in part]

    return share, flat
