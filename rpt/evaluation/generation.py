"""Model-side helpers shared by the evaluation scripts: load a checkpoint, sample a list of
prompts in batches, split the work across processes under ``accelerate launch``."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import torch

from rpt.sampling.config import SamplingConfig
from rpt.sampling.loading import completion_text, load_model, load_tokenizer, rpt_window_of

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def add_model_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """``--checkpoint`` (optional with ``required=False``, for scripts that can also run without
    a model), ``--device``, ``--dtype``, ``--batch-size``."""
    group = parser.add_argument_group("model")
    group.add_argument("--checkpoint", required=required, help="RPT checkpoint (or a plain HF causal LM for --rpt-iters 0)")
    group.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    group.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    group.add_argument("--batch-size", type=int, default=8, help="prompts decoded together")


def load_checkpoint(checkpoint: str, device: str = "cpu", dtype: str = "float32"):
    """``(model, tokenizer, trained_window)``; ``trained_window`` is None for a plain causal LM."""
    tokenizer = load_tokenizer(checkpoint)
    window = rpt_window_of(checkpoint)
    model = load_model(checkpoint, window, device, DTYPES[dtype])
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
    on_batch: Callable[[int], None] | None = None,
) -> list[dict]:
    """Continuations of ``prompts``: per prompt ``text`` (cut at ``config.stop``), ``prompt_ids``,
    ``new_ids``, ``finish_reason``; plus the batch's decoding stats under ``stats``."""
    from rpt.sampling.rpt import generate

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    device = next(model.parameters()).device
    out: list[dict] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        encoded = [tokenizer(p)["input_ids"] for p in chunk]
        width = max(len(e) for e in encoded)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, e in enumerate(encoded):
            ids[b, width - len(e) :] = torch.tensor(e)
            mask[b, width - len(e) :] = 1
        result = generate(model, ids.to(device), config, attention_mask=mask.to(device), tokenizer=tokenizer)
        for b, e in enumerate(encoded):
            new = result.generated(b)
            # the prompt as fed: shorter than ``e`` when token healing backed it up
            fed = result.sequences[b, result.prompt_width - result.prompt_lengths[b] : result.prompt_width].tolist()
            out.append({
                "text": completion_text(tokenizer, e, fed, new, config.stop), "prompt_ids": e, "new_ids": new,
                "finish_reason": result.finish_reasons[b], "stats": dict(result.stats),
            })
        if on_batch is not None:
            on_batch(len(chunk))
    return out


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
