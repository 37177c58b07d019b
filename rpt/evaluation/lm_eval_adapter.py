"""lm-evaluation-harness model ``rpt``: generation with RPT sampling, log-likelihoods from NTP.

    python eval/lm_eval.py --model rpt --model_args pretrained=runs/demo/rpt/final,rpt_iters=1 \\
        --tasks gsm8k_local --include_path eval/lm_eval_tasks --limit 4 --output_path runs/lm_eval

``model_args``: ``pretrained`` (an RPT checkpoint, or a plain HF causal LM for ``rpt_iters=0``),
``device``, ``dtype`` (``float32`` | ``bfloat16`` | ``float16``), ``batch_size``, ``max_length``,
``compile`` (``true``: decode with ``generate(compile=True)``; default off), and every :class:`~rpt.sampling.SamplingConfig` field by name (``rpt_iters``, ``rpt_window``,
``confidence``, ``ptp_greedy``, ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``lz_penalty``,
``repetition_penalty``, ``token_healing``, ``seed``, ...; ``stop`` joins strings with ``|``).
Each is parsed strictly (:mod:`rpt.evaluation.lm_eval_args`): integers as integers (``rpt_iters=1.7``
is an error), booleans as ``true`` / ``false``, ``batch_size`` an integer >= 1 or ``auto`` (8),
unknown keys refused, each error one line naming the key, before the checkpoint is loaded.

``generate_until``: a task's ``until`` strings are added to the stop strings, ``max_gen_toks`` is
``max_new_tokens``; the task's ``temperature`` / ``do_sample`` apply unless ``model_args`` set a
temperature. ``loglikelihood`` and ``loglikelihood_rolling`` score with next-token prediction
(the model's NTP head, no offsets), the standard way, in batches.

Needs the ``lm-eval`` extra (``pip install -e '.[lm-eval]'``); importing this module registers
the model.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from rpt.cli.devices import check_device
from rpt.evaluation.batched_generation import generate_texts, load_checkpoint
from rpt.evaluation.lm_eval_args import (
    ModelArgsError,
    batch_size_of,
    dtype_of,
    max_length_of,
    parse_bool,
    sampling_knobs,
)
from rpt.sampling.config import SamplingConfig
from rpt.sampling.loading import check_checkpoint
from rpt.sampling.text import chat


@register_model("rpt")
class RPTLM(LM):
    """lm-eval's ``LM`` over an RPT checkpoint."""

    def __init__(self, pretrained: str | None = None, device: str = "cpu", dtype: str = "float32", batch_size: int | str = 8,
                 max_length: int | None = None, compile: bool | str = False, **sampling) -> None:
        super().__init__()
        # Every argument checked before the checkpoint is loaded (rpt.evaluation.lm_eval_args).
        if not pretrained:
            raise ModelArgsError("--model_args needs pretrained=<checkpoint directory> (an RPT checkpoint, or a plain "
                                 "causal LM with rpt_iters=0)")
        self.knobs = sampling_knobs(sampling)
        dtype, self.batch_size, max_length = dtype_of(dtype), batch_size_of(batch_size), max_length_of(max_length)
        device = str(device or "cpu")
        if device.startswith("cuda") and not torch.cuda.is_available():
            device = "cpu"  # lm-eval's command line passes --device cuda by default
        check_device(device, flag="device")
        SamplingConfig(**self.knobs)  # a bad knob is named before loading
        self.pretrained = str(pretrained)
        self.model, self.tokenizer, self.window = load_checkpoint(self.pretrained, device, dtype)
        self.config = SamplingConfig(**{"eos_token_id": self.tokenizer.eos_token_id, **self.knobs})
        check_checkpoint(self.window, self.config, str(pretrained))
        self.compile = parse_bool("compile", compile)  # model_args arrive as strings: true / false, strictly
        self.max_length = int(max_length or getattr(self.model.config, "max_position_embeddings", 2048))
        self._device = torch.device(device)

    @property
    def device(self):
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return getattr(self.tokenizer, "name_or_path", "rpt").replace("/", "__")

    # ---- generation ---------------------------------------------------------------------------
    def config_for(self, gen_kwargs: dict) -> SamplingConfig:
        """The sampling config of one request: model_args first, then the task's kwargs."""
        gen_kwargs = dict(gen_kwargs or {})
        until = gen_kwargs.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        changes = {"stop": [*self.config.stop, *until]}
        if "max_gen_toks" in gen_kwargs:
            changes["max_new_tokens"] = int(gen_kwargs.pop("max_gen_toks"))
        if "temperature" not in self.knobs:
            sample = bool(gen_kwargs.pop("do_sample", False))
            temperature = float(gen_kwargs.pop("temperature", 0.0) or 0.0)
            changes["temperature"] = temperature if sample or temperature > 0 else 0.0
        return dataclasses.replace(self.config, **changes)

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Requests grouped by their config (tasks share one), decoded ``batch_size`` at a time."""
        groups: dict[str, list[int]] = {}
        configs: dict[str, SamplingConfig] = {}
        for i, request in enumerate(requests):
            config = self.config_for(request.args[1])
            key = repr(dataclasses.asdict(config))
            groups.setdefault(key, []).append(i)
            configs[key] = config
        out: list[str | None] = [None] * len(requests)
        for key, indices in groups.items():
            budget = self.max_length - configs[key].max_new_tokens
            prompts = [self.fit(requests[i].args[0], budget) for i in indices]
            for i, result in zip(indices, generate_texts(self.model, self.tokenizer, prompts, configs[key],
                                                         batch_size=self.batch_size, compile=self.compile)):
                out[i] = result["text"]
                self.cache_hook.add_partial("generate_until", requests[i].args, result["text"])
        return out

    def fit(self, prompt: str, budget: int) -> str:
        """``prompt`` cut from the left to at most ``budget`` tokens (as lm-eval's HF model does:
        a long few-shot prompt loses its first shots, not the question)."""
        if budget < 1:
            raise ValueError(f"max_new_tokens leaves no room for a prompt in {self.max_length} tokens")
        ids = self.tokenizer(prompt)["input_ids"]
        keep = budget
        while len(ids) > budget:
            cut = self.tokenizer.decode(ids[len(ids) - keep:])
            if len(self.tokenizer(cut)["input_ids"]) <= budget:
                return cut
            keep -= 1  # re-encoding the cut text can take a token more: keep fewer until it fits
        return prompt

    # ---- chat (lm-eval's --apply_chat_template) --------------------------------------------------
    def chat_template(self, chat_template: bool | str = False) -> str | None:
        """The tokenizer's template, checked once before any request is built (a template that fails is
        one :class:`~rpt.sampling.text.chat.ChatTemplateError` line, as under ``--chat`` elsewhere)."""
        if not chat_template:
            return None
        if isinstance(chat_template, str) and chat_template not in ("default", "true", "True"):
            raise ValueError(f"--apply_chat_template {chat_template}: the rpt model applies the tokenizer's default "
                             "chat template; pass --apply_chat_template without a name")
        chat.require_chat_template(self.tokenizer, self.pretrained, flag="--apply_chat_template")
        return chat.template_text(self.tokenizer)

    def apply_chat_template(self, chat_history: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text of ``chat_history`` (:func:`rpt.sampling.text.chat.render`: one BOS, like every entry point)."""
        return chat.render(self.tokenizer, chat_history, add_generation_prompt=add_generation_prompt)

    # ---- log-likelihoods (NTP) ------------------------------------------------------------------
    @torch.no_grad()
    def _continuation_logprobs(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """``(sum log p(continuation | context), greedy?)`` per ``(context ids, continuation ids)``."""
        results = []
        for start in range(0, len(pairs), self.batch_size):
            chunk = pairs[start : start + self.batch_size]
            seqs = [(ctx + cont)[-(self.max_length + 1):] for ctx, cont in chunk]
            width = max(len(s) - 1 for s in seqs)
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            ids = torch.full((len(seqs), width), pad, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for b, seq in enumerate(seqs):  # right padding: positions start at 0 for every row
                ids[b, : len(seq) - 1] = torch.tensor(seq[:-1])
                mask[b, : len(seq) - 1] = 1
            logits = self.model(ids.to(self.device), attention_mask=mask.to(self.device)).logits.float()
            logprobs = F.log_softmax(logits, dim=-1).cpu()
            for b, ((_ctx, cont), seq) in enumerate(zip(chunk, seqs)):
                n = len(cont)
                targets = torch.tensor(seq[-n:])
                rows = logprobs[b, len(seq) - 1 - n : len(seq) - 1]
                total = float(rows.gather(1, targets[:, None]).sum())
                results.append((total, bool((rows.argmax(dim=-1) == targets).all())))
        return results

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _prefix(self) -> list[int]:
        eos = self.tokenizer.eos_token_id
        return [eos] if eos is not None else []

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = []
        for request in requests:
            context, continuation = request.args
            # trailing spaces of the context belong to the continuation (as lm-eval's HF model does)
            spaces = len(context) - len(context.rstrip())
            if spaces:
                context, continuation = context[:-spaces], context[-spaces:] + continuation
            if not context:
                pairs.append((self._prefix(), self._encode(continuation)))
                continue
            whole, ctx = self._encode(context + continuation), self._encode(context)
            pairs.append((ctx, whole[len(ctx):]))
        results = self._continuation_logprobs(pairs)
        for request, result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", request.args, result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Whole-text log-likelihood, ``max_length`` tokens scored per window, each window seeing
        as much of the text before it as fits."""
        out = []
        for request in requests:
            tokens = self._encode(request.args[0])
            total = 0.0
            for lo in range(0, len(tokens), self.max_length):
                piece = tokens[lo : lo + self.max_length]
                total += self._continuation_logprobs([(self._prefix() + tokens[:lo], piece)])[0][0]
            out.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return out
