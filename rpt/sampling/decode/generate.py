r"""``generate``: the fast decoder's entry -- the inputs prepared, the rows decoded by the per-row driver
on a KV cache (:class:`~rpt.sampling.decode.driver.Decoder`, which hands plain NTP and RPT's common steps to
the batch-flat paths), and a compiled decode that fails decoded again eagerly.

How the driver lays out the rows, plans a call and reuses the cache: :mod:`rpt.sampling.decode.driver`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable

import torch

from rpt.decode_forward.compile_guard import STRICT_ENV, CompileFailure, decode_dynamo_settings, strict
from rpt.sampling.config import SamplingConfig
from rpt.sampling.decode.driver import Decoder
from rpt.sampling.decode.inputs import DecodeInputs, prepare_decode
from rpt.sampling.output import GenerateOutput
from rpt.sampling.text.token_stream import ReplayGuard


@torch.no_grad()
def generate(model, input_ids: torch.Tensor, config: SamplingConfig, attention_mask: torch.Tensor | None = None,
             *, tokenizer=None, streamer=None, row_seeds: list[int] | None = None,
             compile: bool | str | Callable = False) -> GenerateOutput:
    """Sample continuations of ``input_ids`` (``[batch, T]``, left-padded with ``attention_mask``) with RPT.

    Args:
        model: an :class:`~rpt.model.RPTForCausalLM` (any HF causal LM that takes position ids -- not
            an ALiBi one, :mod:`rpt.model.architectures` -- when ``rpt_iters == 0``), in
            eval mode, with full-attention layers or sliding-window ones whose window covers the
            decode (sdpa or eager; flex / flash attention models run the calls with a custom mask
            with sdpa). NaN / inf logits raise ``ValueError``.
        input_ids, attention_mask: the prompts; rows of different lengths are left-padded.
        config: every knob (``rpt_iters = 0`` is plain NTP sampling); ``eos_token_id=None`` stops
            at the model's ``generation_config`` EOS and the tokenizer's (``[]``: never). Each row's
            budget is ``max_new_tokens`` or what its own prompt leaves of the context.
        tokenizer: needed for stop strings and token healing.
        streamer: for a single prompt, an object with ``put(ids)`` / ``end()`` (Hugging Face
            streamer protocol; the first ``put`` is the prompt) that receives each generated token
            once RPT can no longer change it.
        row_seeds: one seed per row keying its random draws (default a hash of ``(config.seed, b)``:
            :func:`~rpt.sampling.randomness.row_seed`, so runs with different seeds share no draws); the
            same seed gives a row the same tokens in any batch and in :func:`generate_reference` in
            float32 / float64; in bfloat16 / float16 a batch's kernels may round a logit differently
            and so move a near tie (as in Hugging Face ``generate``).
        compile: compile the decode steps with ``torch.compile`` (fixed shapes: the query block is
            padded to a bucket size, the whole cache attended, the decode state in static buffers
            pooled per capacity bucket, :mod:`rpt.sampling.decode.buffers`); a string (or a callable)
            names the backend. On a CUDA device with inductor the batch-flat steps replay from CUDA
            graphs (:mod:`rpt.sampling.decode.compile_mode`) and plain NTP reads the host once per
            :func:`~rpt.sampling.decode.compile_mode.steps_per_read` steps.

    Returns:
        :class:`~rpt.sampling.output.GenerateOutput`: ``.sequences`` (``[batch, prompt_width + new]``, the
        prompts then the generated tokens, padded after a row finished), ``.generated(row)``,
        ``.finish_reasons`` (``"eos"``, ``"stop"`` or ``"length"`` per row), ``.stats``, ``.row_seeds``.

    Raises:
        ValueError: bad inputs (prompts not left-padded, a token outside the vocabulary, an empty row,
            token healing without a tokenizer, a model this decoder cannot run), named in one line before
            any model call; NaN / inf logits during the decode.

    Example:
        Two prompts, the first left-padded, three new tokens each with one RPT iteration (a random tiny
        Llama, so the tokens mean nothing):

        >>> import torch
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> from rpt.model import RPTForCausalLM
        >>> from rpt.sampling import SamplingConfig, generate
        >>> _ = torch.manual_seed(0)
        >>> base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
        ...                                     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
        >>> model = RPTForCausalLM.from_base(base, window=2).eval()
        >>> input_ids = torch.tensor([[0, 0, 5, 6], [1, 2, 3, 4]])
        >>> attention_mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
        >>> config = SamplingConfig(max_new_tokens=3, rpt_iters=1, rpt_window=2, temperature=0.8, seed=0,
        ...                         eos_token_id=[])
        >>> out = generate(model, input_ids, config, attention_mask)
        >>> out.sequences.shape
        torch.Size([2, 7])
        >>> out.finish_reasons, len(out.generated(0))
        (['length', 'length'], 3)
        >>> torch.equal(generate(model, input_ids, config, attention_mask).sequences, out.sequences)  # seeded
        True
    """
    # nothing of the model is switched for the decode (two threads may decode with it at once): the offset
    # rows' range check is skipped per call (rpt.decode_forward.queries), the attention switch is shared (rpt.shared_switch)
    with torch.inference_mode():  # fewer per-op checks than no_grad; nothing here needs autograd
        start = time.perf_counter()
        inputs = prepare_decode(model, config, input_ids, attention_mask, tokenizer, streamer, row_seeds)
        if compile:
            out = _compiled_decode(model, inputs, input_ids, streamer, start, compile)
        else:
            with Decoder(model, inputs, input_ids, streamer, start, False) as decoder:
                out = decoder.run()
    out.sequences = out.sequences.clone()  # a normal tensor, so callers may edit it in place
    return out


def _compiled_decode(model, inputs: DecodeInputs, input_ids: torch.Tensor, streamer, start: float,
                     compile: str | Callable | bool) -> GenerateOutput:
    """The compiled decode; one that fails to compile, capture or replay (:mod:`rpt.decode_forward.compile_guard`)
    is decoded again eagerly from the prompt, with one warning and ``stats["compile_fallback"]`` (in
    strict mode the failure is raised). The failure is remembered by the bucket, keyed to its cause
    (:meth:`~rpt.sampling.decode.buffers.DecodeBuffers.skip`). Bad inputs are refused before any of
    this (:func:`~rpt.sampling.decode.inputs.prepare_decode`): they are never a compile failure."""
    watched = None if streamer is None else ReplayGuard(streamer)
    try:
        with decode_dynamo_settings():
            decoder = Decoder(model, inputs, input_ids, watched, start, compile)
            lent = decoder.lent
            try:
                out = decoder.run()
            except CompileFailure as failure:
                if lent is not None:  # the bucket's next decodes of this cause run eagerly at once
                    lent.remember(str(failure), decoder.cause)
                raise
            finally:
                decoder.close()
            if lent is not None:
                lent.compiled(decoder.cause)
            return out
    except CompileFailure as failure:
        if strict():
            raise
        reason = str(failure)
    warnings.warn(f"generate(compile={compile!r}) could not run compiled ({reason}); this decode ran eagerly "
                  f"(set {STRICT_ENV}=1 to raise instead)", RuntimeWarning, stacklevel=4)
    with Decoder(model, inputs, input_ids, None if watched is None else watched.restarted(), start, False) as decoder:
        out = decoder.run()
    out.stats["compile_fallback"] = reason
    return out
