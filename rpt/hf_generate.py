"""RPT sampling behind ``model.generate(custom_generate=<checkpoint>, trust_remote_code=True, ...)``.

transformers runs ``custom_generate/generate.py`` of a checkpoint directory (or hub repo) in place
of its own ``generate``; every RPT checkpoint carries one (:func:`rpt.checkpoint.custom_generate.write_custom_generate`) that
calls :func:`generate` here. The model is the plain HF model (``AutoModelForCausalLM``); its
checkpoint's offset table (:mod:`rpt.checkpoint.folded_weights`) turns it back into the RPT model, sharing its
weights, and :func:`rpt.sampling.generate` decodes: token for token what the package's own API
gives on ``RPTForCausalLM.from_pretrained`` of the same checkpoint.

Keywords: every :class:`~rpt.sampling.SamplingConfig` field (``rpt_iters``, ``confidence``,
``temperature``, ``lz_penalty``, ``seed``, ...), plus the HF spellings ``do_sample`` (``False``:
greedy; ``True`` without a temperature: temperature 1), ``max_new_tokens``, ``eos_token_id``,
``attention_mask``, ``streamer``, ``tokenizer`` (stop strings, token healing),
``rpt_checkpoint`` (where the table is, default the directory the model was loaded from) and
``compile`` (``True`` or a backend name: :func:`rpt.sampling.generate`'s ``compile``; default off).
Returns the ``[batch, prompt + new]`` sequences like HF, or with ``return_dict_in_generate=True``
the :class:`~rpt.sampling.GenerateOutput`. Of the model's ``generation_config`` only
``eos_token_id`` is read (the defaults are :class:`~rpt.sampling.SamplingConfig`'s: greedy, 256
new tokens); a ``generation_config=`` argument, beams or logits processors are errors that say so.
"""

from __future__ import annotations

import dataclasses

import torch

from rpt.checkpoint.model_ref import resolve_model_ref
from rpt.checkpoint.rpt_config import read_rpt_config
from rpt.model.wrapper import RPT_CONFIG_NAME, RPTForCausalLM
from rpt.sampling.config import SamplingConfig
from rpt.sampling.decode.generate import generate as rpt_generate
from rpt.sampling.loading import check_checkpoint
from rpt.shared_switch import switched

_FIELDS = {f.name for f in dataclasses.fields(SamplingConfig)}
# Arguments transformers' generate forwards on every call; they carry nothing RPT uses.
_HF_IGNORED = {"pad_token_id", "use_cache", "synced_gpus", "use_model_defaults",
               "output_scores", "output_logits", "do_sample"}


def sampling_config(model, kwargs: dict) -> SamplingConfig:
    """The :class:`SamplingConfig` the keywords ask for (an unknown keyword is a ``ValueError``)."""
    unknown = sorted(k for k, v in kwargs.items() if k not in _FIELDS | _HF_IGNORED and v is not None)
    if unknown:
        raise ValueError(f"RPT custom_generate does not take {unknown}; it takes the SamplingConfig fields "
                         f"({', '.join(sorted(_FIELDS))}), do_sample, attention_mask, streamer, tokenizer, "
                         "rpt_checkpoint, compile and return_dict_in_generate")
    fields = {k: v for k, v in kwargs.items() if k in _FIELDS and v is not None}
    do_sample = kwargs.get("do_sample")
    if do_sample is False:
        fields["temperature"] = 0.0
    elif do_sample and "temperature" not in fields:
        fields["temperature"] = 1.0  # HF's do_sample=True default
    if "eos_token_id" not in fields and getattr(model, "generation_config", None) is not None:
        eos = model.generation_config.eos_token_id
        if eos is not None:
            fields["eos_token_id"] = eos
    return SamplingConfig(**fields)


def rpt_model_for(model, checkpoint: str | None, rpt_iters: int):
    """The RPT model on ``model``'s weights (no copy), or ``model`` itself for plain NTP sampling."""
    if checkpoint is None:
        checkpoint = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", None)
    else:
        checkpoint = resolve_model_ref(checkpoint, "rpt_checkpoint", "give the RPT checkpoint directory")
    rpt_config = read_rpt_config(checkpoint) if checkpoint else None
    if rpt_config is None:
        if rpt_iters == 0:
            return model
        raise ValueError(f"rpt_iters={rpt_iters} needs the offset table of an RPT checkpoint, and {checkpoint!r} has no "
                         f"{RPT_CONFIG_NAME}; load the model from an RPT checkpoint or pass rpt_checkpoint=<its directory>")
    return RPTForCausalLM.attach_table(model, checkpoint)


def generate(model, input_ids: torch.Tensor | None = None, inputs: torch.Tensor | None = None,
             attention_mask: torch.Tensor | None = None, streamer=None, tokenizer=None,
             rpt_checkpoint: str | None = None, return_dict_in_generate: bool | None = None,
             compile: bool | str = False, **kwargs):
    """``model.generate``'s replacement; see the module docstring."""
    ids = input_ids if input_ids is not None else inputs
    if ids is None:
        raise ValueError("pass the prompt token ids as input_ids (a [batch, T] LongTensor, left-padded with attention_mask)")
    config = sampling_config(model, kwargs)
    rpt = rpt_model_for(model, rpt_checkpoint, config.rpt_iters)
    check_checkpoint(getattr(rpt, "window", None), config, str(rpt_checkpoint or model.name_or_path))
    def to_eval() -> bool:
        was = rpt.training
        rpt.eval()
        return was

    # in eval mode for the decode and as found after it, counted per base model (a wrapper made per call
    # shares it): two threads' calls overlapping on a model in training mode leave it so (rpt.shared_switch)
    with switched(("eval mode", id(getattr(rpt, "lm", rpt))), to_eval, rpt.train):
        out = rpt_generate(rpt, ids, config, attention_mask, tokenizer=tokenizer, streamer=streamer, compile=compile)
    return out if return_dict_in_generate else out.sequences
