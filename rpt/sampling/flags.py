"""Command-line flags for every :class:`~rpt.sampling.config.SamplingConfig` knob, shared by
``sample.py`` and the evaluation scripts.

    parser = argparse.ArgumentParser()
    add_sampling_args(parser)                        # --temperature, --rpt-iters, --lz-penalty, ...
    args = parser.parse_args()
    config = sampling_config_from_args(args, tokenizer)

A field ``foo_bar`` becomes ``--foo-bar`` (booleans: ``--foo-bar / --no-foo-bar``), with the
config's default; ``--stop`` may be repeated and understands ``\\n``, ``\\t`` and ``\\\\`` escapes.
The EOS token defaults to the tokenizer's (``--eos-token-id`` overrides it, ``--ignore-eos`` drops
it). Scripts that sweep a knob themselves (``--rpt-iters 0 1 2``) pass its name in ``exclude`` and
give the value to :func:`sampling_config_from_args` as an override.
"""

from __future__ import annotations

import argparse
import dataclasses
import re

from rpt.sampling.config import SamplingConfig

_HELP = {
    "max_new_tokens": "maximum number of generated tokens per prompt",
    "temperature": "sampling temperature; 0 = greedy",
    "top_k": "keep the k most likely tokens (0 = off)",
    "top_p": "nucleus sampling mass (1 = off)",
    "min_p": "drop tokens below min_p x the top probability (0 = off)",
    "rpt_iters": "RPT iterations k per position (0 = plain next-token sampling)",
    "rpt_window": "RPT window w (2 or 3; at most the trained window)",
    "ptp_greedy": "PTP proposals are the argmax (else sampled at the temperature)",
    "confidence": "accept a PTP proposal only if its probability exceeds this (paper: 0.9)",
    "repetition_penalty": "CTRL repetition penalty (1 = off)",
    "frequency_penalty": "OpenAI frequency penalty over generated tokens (0 = off)",
    "presence_penalty": "OpenAI presence penalty over generated tokens (0 = off)",
    "lz_penalty": "LZ penalty alpha (0 = off; paper: 0.15)",
    "lz_window": "LZ penalty window W",
    "lz_buffer": "LZ penalty maximum match length B",
    "lz_variant": "LZ penalty variant: codelength (per-token LZSS cost) or closest_longest (log2 distance "
                  "of the closest longest match)",
    "lz_include_prompt": "let the LZ window see the prompt (default: generated tokens only)",
    "penalize_ptp": "apply NTP's penalties at position j to PTP proposals for x_j",
    "token_healing": "heal the prompt boundary (re-spell its last tokens canonically)",
    "stop": "stop string (repeatable; \\n and \\t escapes understood)",
    "eos_token_id": "end-of-sequence token id (repeatable; default: the tokenizer's)",
    "seed": "random seed: row i of the prompts draws with a hash of (seed, i) (same seed, same output, any batch size)",
}

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def unescape(text: str) -> str:
    """``\\n``, ``\\t``, ``\\r`` and ``\\\\`` as typed in a shell; any other backslash stays."""
    return re.sub(r"\\([ntr\\])", lambda m: _ESCAPES[m.group(1)], text)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


COMPILE_HELP = ("torch.compile the decode steps (fixed shapes, buffers pooled per capacity bucket; on CUDA the "
                "steps replay from CUDA graphs). Pays for long or many decodes on a GPU; off by default, so the "
                "scores do not move (compiled kernels may round a near tie differently)")


def add_compile_arg(parser) -> None:
    """``--compile`` (off by default) on a parser or argument group of a script that decodes."""
    parser.add_argument("--compile", action="store_true", help=COMPILE_HELP)


def add_sampling_args(parser: argparse.ArgumentParser, exclude: tuple[str, ...] | list[str] = ()) -> argparse._ArgumentGroup:
    """Add one flag per ``SamplingConfig`` field (minus ``exclude``) in a "sampling" group."""
    group = parser.add_argument_group("sampling")
    defaults = SamplingConfig()
    for f in dataclasses.fields(SamplingConfig):
        if f.name in exclude:
            continue
        default = getattr(defaults, f.name)
        help_text = _HELP.get(f.name, f.name)
        if f.name == "stop":
            group.add_argument("--stop", action="append", default=None, type=unescape, metavar="TEXT", help=help_text)
        elif f.name == "eos_token_id":
            group.add_argument("--eos-token-id", action="append", default=None, type=int, metavar="ID", help=help_text)
            group.add_argument("--ignore-eos", action="store_true", help="do not stop at any end-of-sequence token")
        elif f.name == "seed":
            group.add_argument("--seed", type=int, default=None, help=help_text)
        elif isinstance(default, bool):
            group.add_argument(_flag(f.name), action=argparse.BooleanOptionalAction, default=default,
                               help=help_text + " (default: %(default)s)")
        else:
            group.add_argument(_flag(f.name), type=type(default), default=default,
                               help=help_text + " (default: %(default)s)")
    return group


def sampling_config_from_args(args: argparse.Namespace, tokenizer=None, **overrides) -> SamplingConfig:
    """The validated config from parsed flags; ``overrides`` win (raises ``ValueError`` when invalid)."""
    values = {}
    for f in dataclasses.fields(SamplingConfig):
        if hasattr(args, f.name):
            values[f.name] = getattr(args, f.name)
    if values.get("stop") is None:
        values.pop("stop", None)
    eos = values.get("eos_token_id")
    if getattr(args, "ignore_eos", False):
        values["eos_token_id"] = []  # an empty list: no EOS (None would mean the model's / tokenizer's)
    elif eos is None and tokenizer is not None and tokenizer.eos_token_id is not None:
        values["eos_token_id"] = int(tokenizer.eos_token_id)
    elif isinstance(eos, list) and len(eos) == 1:
        values["eos_token_id"] = eos[0]
    values.update(overrides)
    return SamplingConfig(**values)
