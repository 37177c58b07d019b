"""``RPTForCausalLM``: any Hugging Face causal LM plus the learned embedding of ``tau - sigma``.

The wrapper adds one ``nn.Embedding(w + 1, hidden)`` (``offset_embedding``) to the token
embeddings and feeds ``position_ids = sigma - 1`` to the base model (RoPE models rotate by them,
GPT-2 style models look them up), so one network computes the NTP conditional and every PTP-l
conditional of the permuted-window objective (see :mod:`rpt.model.objective`).

The table is **zero-initialised**, so a freshly wrapped model computes exactly the base model's
logits: fine-tuning starts from the pretrained NTP model, as in the paper.

A checkpoint is a normal HF directory (config + safetensors + tokenizer) plus ``rpt_config.json``
and the offset table in ``rpt_table/offset_embedding.safetensors``. Its base weights hold the
table's NTP row folded into the input embedding (format version 2, :mod:`rpt.checkpoint.folded_weights`), so
``AutoModelForCausalLM`` -- and vLLM -- loads exactly the trained model's next-token predictor;
version-1 checkpoints (unfolded) load here too.

The table lives in a subfolder because engines that serve the plain model (vLLM, SGLang, TGI)
load every top-level ``*.safetensors`` of the directory and refuse a tensor the architecture does
not have. Checkpoints with the table at the top level (:data:`LEGACY_TABLE_NAME`) load here too.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.utils import ModelOutput

from rpt.checkpoint.custom_generate import write_custom_generate
from rpt.checkpoint.directories import CheckpointError, unpickling_detail
from rpt.checkpoint.folded_weights import (
    FORMAT_FOLDED,
    embeddings_tied,
    fold_ntp_row,
    input_embedding_scale,
    module_key,
)
from rpt.checkpoint.rpt_config import (  # noqa: F401  (re-exported: the checkpoint format's names)
    LEGACY_TABLE_NAME,
    RPT_CONFIG_NAME,
    RPT_TABLE_NAME,
    TABLE_KEY,
    TIED_TABLE_KEY,
    RPTConfig,
    check_window_covers,
    offset_rows,
    read_offset_table,
    read_rpt_config,
    table_path,
)
from rpt.model.architectures import check_architecture
from rpt.model.loss import linear_cross_entropy, plan_blocks
from rpt.model.no_padding_mask import no_padding_mask
from rpt.model.objective import IGNORE_INDEX

RPT_FORMAT_VERSION = FORMAT_FOLDED


def load_causal_lm(path_or_id: str, **hf_kwargs) -> PreTrainedModel:
    """``AutoModelForCausalLM.from_pretrained``; a ``.bin`` weights file that its weights-only
    unpickling refuses (a pickle naming a class or function: it could run code) is one
    :class:`CheckpointError` naming the file, not transformers' 10-line ``UnpicklingError``."""
    try:
        return AutoModelForCausalLM.from_pretrained(path_or_id, **hf_kwargs)
    except pickle.UnpicklingError as e:
        local = os.path.expanduser(str(path_or_id))
        bins = sorted(n for n in os.listdir(local) if n.endswith(".bin")) if os.path.isdir(local) else []
        where = os.path.join(local, bins[0]) if len(bins) == 1 else f"{path_or_id} (its .bin weights)"
        raise CheckpointError(f"{where} is not plain tensor data ({unpickling_detail(e)}); transformers reads .bin "
                              "weights weights-only, so it is refused unread: use a copy of the model you trust "
                              "(safetensors weights, ideally)") from None

# Checkpoint kinds whose loader sits above this module (it builds an RPTForCausalLM, so it imports
# this one), by the rpt_config.json section that marks the kind -> the module that registers the
# loader when imported (register_checkpoint_loader). Named, not imported, as transformers' auto
# classes name a model type's module: a static import here would be an import cycle.
CHECKPOINT_LOADER_MODULES = {"lora": "rpt.model.lora"}
_checkpoint_loaders: dict[str, Callable[..., RPTForCausalLM]] = {}


def register_checkpoint_loader(kind: str, loader: Callable[..., RPTForCausalLM]) -> None:
    """Make ``RPTForCausalLM.from_pretrained`` load checkpoints whose ``rpt_config.json`` has a
    ``kind`` section with ``loader(path, rpt_config, window, **hf_kwargs)``."""
    _checkpoint_loaders[kind] = loader


def checkpoint_loader(kind: str) -> Callable[..., RPTForCausalLM]:
    """The registered loader of checkpoint ``kind``, its module imported on first use."""
    if kind not in _checkpoint_loaders:
        importlib.import_module(CHECKPOINT_LOADER_MODULES[kind])  # its import registers the loader
    return _checkpoint_loaders[kind]


@dataclass
class RPTOutput(ModelOutput):
    """Model output plus the per-kind loss split.

    ``kind_loss_sum[l]`` / ``kind_count[l]`` are the summed cross-entropy and the number of
    labelled positions of kind ``l`` (0 = NTP, l = PTP-l); they add up across micro-batches and
    processes, which the per-kind means do not.
    """

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    # transformers >= 5.2x names the KV cache ``cache`` (and maps ``past_key_values=`` to it);
    # the property below keeps ``.past_key_values`` readable on every 5.x.
    cache: object | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    ntp_loss: torch.Tensor | None = None
    ptp_loss: torch.Tensor | None = None
    kind_loss_sum: torch.Tensor | None = None
    kind_count: torch.Tensor | None = None

    @property
    def past_key_values(self):
        return self.cache

    def loss_dict(self) -> dict[str, float]:
        """``{"loss", "ntp_loss", "ptp_loss_1", ...}`` as floats (NaN for a kind with no positions)."""
        out = {"loss": float(self.loss.detach()), "ntp_loss": float(self.ntp_loss.detach())}
        for l, v in enumerate(self.ptp_loss.detach().tolist(), start=1):
            out[f"ptp_loss_{l}"] = v
        return out


def _output(out, **fields) -> RPTOutput:
    """An :class:`RPTOutput` carrying ``out``'s cache, hidden states and attentions."""
    # transformers >= 5.24 outputs hold the KV cache as ``cache``, earlier 5.x as ``past_key_values``
    cache = getattr(out, "cache", None)
    if cache is None:
        cache = getattr(out, "past_key_values", None)
    return RPTOutput(cache=cache, hidden_states=getattr(out, "hidden_states", None),
                     attentions=getattr(out, "attentions", None), **fields)


def save_table(tensors: dict[str, torch.Tensor], path: str | os.PathLike) -> None:
    """Write the offset table into checkpoint directory ``path`` (:data:`RPT_TABLE_NAME`)."""
    target = os.path.join(path, RPT_TABLE_NAME)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    save_file(tensors, target)
    legacy = os.path.join(path, LEGACY_TABLE_NAME)
    if os.path.exists(legacy):  # saved over an old checkpoint: its top-level table would break vLLM's load
        os.remove(legacy)


def split_losses(per_token: torch.Tensor, labels: torch.Tensor, kinds: torch.Tensor | None, window: int):
    """Eq. 13 (mean CE over labelled positions) and the NTP / PTP-l split, without host syncs."""
    valid = (labels != IGNORE_INDEX).to(per_token.dtype)
    per_token = per_token * valid
    loss = per_token.sum() / valid.sum().clamp(min=1.0)
    kinds = torch.zeros_like(labels) if kinds is None else kinds
    flat_kinds = kinds.reshape(-1).clamp(0, window - 1)
    sums = torch.zeros(window, dtype=per_token.dtype, device=per_token.device)
    sums = sums.scatter_add(0, flat_kinds, per_token.reshape(-1))
    counts = torch.zeros_like(sums).scatter_add(0, flat_kinds, valid.reshape(-1))
    means = torch.where(counts > 0, sums / counts.clamp(min=1.0), torch.full_like(sums, float("nan")))
    return loss, means[0], means[1:], sums, counts


class RPTForCausalLM(nn.Module):
    """A causal LM that also predicts previous tokens inside a window of ``w`` tokens.

    Build one with :meth:`from_base` (a loaded HF model) or :meth:`from_pretrained` (a directory or hub
    id), write it with :meth:`save_pretrained`. ``forward`` takes ``input_ids`` and, for PTP,
    ``position_ids`` and ``offset_ids`` (:mod:`rpt.model.objective`); decode with :func:`rpt.sampling.generate`.

    Args:
        base: the Hugging Face causal LM to wrap (its weights, no copy).
        window: ``w >= 2``, the tokens the permuted window spans (the paper uses 2 or 3).

    Raises:
        ValueError: ``window`` is not an integer >= 2.
        rpt.model.architectures.UnsupportedArchitecture: a family RPT cannot hold (ALiBi models).

    Example:
        A freshly wrapped model's next-token logits are the base model's (the offset table starts at zero):

        >>> import torch
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> from rpt.model import RPTForCausalLM
        >>> _ = torch.manual_seed(0)
        >>> base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
        ...                                     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
        >>> model = RPTForCausalLM(base, window=3)
        >>> ids = torch.tensor([[1, 2, 3]])
        >>> torch.equal(model(ids).logits, base(ids).logits)
        True
    """

    def __init__(self, base: PreTrainedModel, window: int):
        super().__init__()
        if not isinstance(window, int) or window < 2:
            raise ValueError(f"window must be an integer >= 2 (got {window!r}); the paper uses w=3")
        check_architecture(base)  # ALiBi models and unfoldable embeddings: one line, before anything is built
        self.lm = base
        self.window = window
        token_embedding = base.get_input_embeddings()
        weight = token_embedding.weight
        self.offset_embedding = nn.Embedding(window + 1, token_embedding.embedding_dim, device=weight.device, dtype=weight.dtype)
        nn.init.zeros_(self.offset_embedding.weight)
        # Host-side range check of offset_ids; a CUDA-graph decoder turns it off.
        self.check_offsets = True
        # The loss computes float32 logits for at most this many bytes of them at a time.
        self.loss_chunk_bytes = 32 << 20
        # The objective the model was trained with ("rpt" | "ntp"), written to rpt_config.json;
        # None: not known (a freshly wrapped base, or a checkpoint from before the record).
        self.objective: str | None = None

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_base(cls, model: PreTrainedModel, window: int) -> RPTForCausalLM:
        """Wrap ``model`` with a zero offset table: logits are exactly the base model's.

        Args:
            model: a Hugging Face causal LM (rotary or learned positions).
            window: ``w >= 2``, the tokens the permuted window spans.

        Returns:
            The wrapped model, sharing ``model``'s weights.

        Raises:
            rpt.model.architectures.UnsupportedArchitecture: a family RPT cannot hold (ALiBi models: BLOOM,
                MPT, Falcon with ``alibi=True``), refused in one line (:mod:`rpt.model.architectures`).

        Example:
            >>> import torch
            >>> from transformers import LlamaConfig, LlamaForCausalLM
            >>> from rpt.model import RPTForCausalLM
            >>> _ = torch.manual_seed(0)
            >>> base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
            ...                                     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
            >>> model = RPTForCausalLM.from_base(base, window=2)
            >>> model.window, model.lm is base
            (2, True)
        """
        return cls(model, window)

    @classmethod
    def from_pretrained(cls, path_or_id: str | os.PathLike, window: int | None = None, retie: bool = True,
                        **hf_kwargs) -> RPTForCausalLM:
        """Load an RPT checkpoint, or wrap a plain HF causal LM (then ``window`` is required).

        Args:
            path_or_id: a checkpoint directory or hub id.
            window: for a plain causal LM, required (the new table's ``w``); for an RPT checkpoint, checked
                to be at most the trained window (the model keeps the trained window and every row).
            retie: a model saved untied because it was tied (:mod:`rpt.checkpoint.folded_weights`) is
                tied again unless ``retie=False``.
            **hf_kwargs: passed to ``AutoModelForCausalLM.from_pretrained`` (``torch_dtype``,
                ``attn_implementation``, ``revision``, ...).

        Returns:
            The model the checkpoint holds; a LoRA checkpoint (:mod:`rpt.model.lora`) loads with its
            adapter merged into the base weights.

        Raises:
            ValueError: a plain causal LM without ``window``, or a ``window`` larger than the trained one.
            rpt.checkpoint.directories.CheckpointError: weights or ``rpt_config.json`` that cannot be read
                safely, named in one line.

        Example:
            >>> import tempfile, torch
            >>> from transformers import LlamaConfig, LlamaForCausalLM
            >>> from rpt.model import RPTForCausalLM
            >>> _ = torch.manual_seed(0)
            >>> base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
            ...                                     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
            >>> rpt_dir, plain_dir = tempfile.mkdtemp(), tempfile.mkdtemp()
            >>> RPTForCausalLM.from_base(base, window=3).save_pretrained(rpt_dir)
            >>> RPTForCausalLM.from_pretrained(rpt_dir).window
            3
            >>> base.save_pretrained(plain_dir)  # a plain causal LM: wrapped with a zero table
            >>> RPTForCausalLM.from_pretrained(plain_dir, window=2).window
            2
        """
        path_or_id = str(path_or_id)
        lookup = {k: hf_kwargs[k] for k in ("revision", "cache_dir", "token", "local_files_only") if k in hf_kwargs}
        rpt_config = read_rpt_config(path_or_id, **lookup)  # checked before any weight is read
        if rpt_config is not None and window is not None:
            check_window_covers(rpt_config.window, window, path_or_id, name="window")
        if rpt_config is not None and rpt_config.lora is not None:  # an adapter directory (rpt.model.lora): merged for inference
            model = checkpoint_loader("lora")(path_or_id, rpt_config, window, **hf_kwargs)
            model.merged_from_lora = True
            return model
        base = load_causal_lm(path_or_id, **hf_kwargs)
        if rpt_config is None:
            if window is None:
                raise ValueError(
                    f"{path_or_id} is a plain causal LM, not an RPT checkpoint (no {RPT_CONFIG_NAME}); "
                    "pass window=W to wrap it with a fresh zero offset table"
                )
            return cls.from_base(base, window)
        return cls.attach_table(base, path_or_id, window, retie=retie, **lookup)

    @classmethod
    def attach_table(cls, base: PreTrainedModel, path_or_id: str | os.PathLike, window: int | None = None,
                     retie: bool = False, **lookup) -> RPTForCausalLM:
        """Wrap ``base`` (its weights, no copy) with the offset table of the RPT checkpoint ``path_or_id``.

        ``base`` must hold that checkpoint's base weights (``AutoModelForCausalLM.from_pretrained`` of it).
        With ``retie`` a checkpoint of a tied-embedding model is tied again (``base`` is changed: its
        input embedding becomes the head's matrix), so the loaded model is the trained one exactly.
        """
        path_or_id = str(path_or_id)
        rpt_config = read_rpt_config(path_or_id, **lookup)
        if rpt_config is None:
            raise ValueError(f"{path_or_id} is not an RPT checkpoint (no {RPT_CONFIG_NAME}); its offset table is needed")
        if window is not None:
            check_window_covers(rpt_config.window, window, path_or_id, name="window")
        hidden = base.get_input_embeddings().embedding_dim
        # Checked against the window and the base's hidden size before the model's table exists.
        tensors = read_offset_table(path_or_id, rpt_config, hidden, **lookup)
        # Version 1 holds E and the absolute table, version 2 E + table[0] and table - table[0]:
        # either way embed() computes E + table[o], so both load the same way.
        model = cls(base, rpt_config.window)
        model.objective = rpt_config.objective
        table = tensors[TABLE_KEY]
        if retie and TIED_TABLE_KEY in tensors and base.get_output_embeddings() is not None:
            # Saving untied a tied model (the head kept E, the input got E + table[0]); tie it again
            # with the absolute table, bit for bit the trained model, so that a fine-tune from it
            # (init_from) trains one shared matrix as the original did, not two.
            base.get_input_embeddings().weight = base.get_output_embeddings().weight
            base.config.tie_word_embeddings = True
            table = tensors[TIED_TABLE_KEY]
        model.offset_embedding.weight.data.copy_(table.to(model.offset_embedding.weight.dtype))
        return model

    def save_pretrained(self, path: str | os.PathLike, state_dict: dict[str, torch.Tensor] | None = None, **hf_kwargs) -> None:
        """Write a faithful HF checkpoint (NTP row folded in, :mod:`rpt.checkpoint.folded_weights`) plus the
        relative offset table, ``rpt_config.json`` and ``custom_generate/``. The in-memory model is not changed.

        Args:
            path: the directory to write (created if missing).
            state_dict: keys as in ``self.state_dict()``; lets a sharded run (DeepSpeed ZeRO-3) pass its
                gathered weights (default: this model's).
            **hf_kwargs: passed to the base model's ``save_pretrained`` (``safe_serialization``, ...).

        Example:
            ``AutoModelForCausalLM`` loads the directory as the trained model's next-token predictor:

            >>> import os, tempfile, torch
            >>> from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
            >>> from rpt.model import RPTForCausalLM
            >>> _ = torch.manual_seed(0)
            >>> base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
            ...                                     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
            >>> model = RPTForCausalLM.from_base(base, window=2)
            >>> path = tempfile.mkdtemp()
            >>> model.save_pretrained(path)
            >>> sorted(os.listdir(path))
            ['config.json', 'custom_generate', 'generation_config.json', 'model.safetensors', 'rpt_config.json', 'rpt_table']
            >>> ids = torch.tensor([[1, 2, 3]])
            >>> torch.allclose(AutoModelForCausalLM.from_pretrained(path)(ids).logits, model(ids).logits)
            True
        """
        os.makedirs(path, exist_ok=True)
        if state_dict is None:
            base_state, absolute = self.lm.state_dict(), self.offset_embedding.weight.detach()
        else:
            base_state = {k[len("lm."):]: v for k, v in state_dict.items() if k.startswith("lm.")}
            absolute = state_dict["offset_embedding.weight"]
        input_key = module_key(self.lm, self.lm.get_input_embeddings())
        output_key = module_key(self.lm, self.lm.get_output_embeddings())
        tied = embeddings_tied(self.lm)
        if tied and output_key not in base_state:
            base_state = {**base_state, output_key: base_state[input_key]}  # a gathered tied state names one copy
        base_state, table = fold_ntp_row(base_state, absolute, input_key, output_key, tied,
                                         scale=input_embedding_scale(self.lm.get_input_embeddings()))
        config = self.lm.config
        was_tied = getattr(config, "tie_word_embeddings", None)
        if tied:
            config.tie_word_embeddings = False  # the saved head keeps E, the input embedding E + table[0]
        try:
            self.lm.save_pretrained(path, state_dict=base_state, **hf_kwargs)
        finally:
            if tied:
                config.tie_word_embeddings = was_tied
        tensors = {"offset_embedding.weight": table.detach().cpu().contiguous()}
        if tied:  # the absolute table too: RPTForCausalLM.from_pretrained ties the model again, exactly
            tensors[TIED_TABLE_KEY] = absolute.detach().cpu().contiguous()
        save_table(tensors, path)
        with open(os.path.join(path, RPT_CONFIG_NAME), "w") as f:
            json.dump({"window": self.window, "offset_rows": offset_rows(self.window), "format_version": RPT_FORMAT_VERSION,
                       "ntp_row_folded": True, "untied_embeddings": tied, **self.objective_record()}, f, indent=2)
        write_custom_generate(path)  # model.generate(custom_generate=path, ...) runs RPT (rpt.hf_generate)

    def objective_record(self) -> dict[str, str]:
        """``{"objective": ...}`` for rpt_config.json, or nothing when it is not known."""
        return {} if self.objective is None else {"objective": self.objective}

    # ---- HF-like conveniences --------------------------------------------------------------
    @property
    def config(self):
        return self.lm.config

    @property
    def device(self) -> torch.device:
        return self.offset_embedding.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm.dtype

    def gradient_checkpointing_enable(self, **kwargs) -> None:
        # Non-reentrant: the inputs are embeddings computed outside the checkpointed blocks.
        ckpt_kwargs = kwargs.pop("gradient_checkpointing_kwargs", None) or {"use_reentrant": False}
        if hasattr(self.lm, "activation_checkpointing_enable"):
            self.lm.activation_checkpointing_enable(activation_checkpointing_kwargs=ckpt_kwargs, **kwargs)
        else:
            self.lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs=ckpt_kwargs, **kwargs)

    def gradient_checkpointing_disable(self) -> None:
        if hasattr(self.lm, "activation_checkpointing_disable"):
            self.lm.activation_checkpointing_disable()
        else:
            self.lm.gradient_checkpointing_disable()

    # ---- forward ---------------------------------------------------------------------------
    def embed(self, input_ids: torch.Tensor, offset_ids: torch.Tensor | None = None, check: bool | None = None) -> torch.Tensor:
        """Token embedding plus offset embedding (row 0, the NTP "+1" offset, when none given); ``check``
        (default ``self.check_offsets``) reads ``offset_ids`` on the host to name a row out of range."""
        embeds = self.lm.get_input_embeddings()(input_ids)
        if offset_ids is None:
            return embeds + self.offset_embedding.weight[0].to(embeds.dtype)
        if (self.check_offsets if check is None else check) and not torch.compiler.is_compiling():
            lo, hi = torch.stack(torch.aminmax(offset_ids)).tolist()  # one host sync per forward
            if lo < 0 or hi > self.window:
                raise ValueError(
                    f"offset_ids must index the {self.window + 1}-row offset table (0..{self.window}); got values in "
                    f"[{lo}, {hi}]. Build them with rpt.model.objective.offset_to_row(tau - sigma, window)"
                )
        return embeds + self.offset_embedding(offset_ids).to(embeds.dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        offset_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values=None,
        labels: torch.Tensor | None = None,
        kinds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        check_offsets: bool | None = None,
        **kwargs,
    ) -> RPTOutput:
        """Logits for every fed token; with ``labels`` (already aligned: ``labels[i] = x[tau_i]``,
        no shift) instead the eq. 13 loss and its NTP / PTP-l split by ``kinds`` (and no logits:
        the loss never holds them for the whole batch, see :mod:`rpt.model.loss`).

        Without ``position_ids`` / ``offset_ids`` this is plain next-token prediction. ``check_offsets=False``
        skips the host read that checks ``offset_ids`` (training: the objective built them in range).
        """
        inputs_embeds = self.embed(input_ids, offset_ids, check=check_offsets)
        if position_ids is not None and attention_mask is None and past_key_values is None:
            # transformers reads non-consecutive position_ids without a mask as packed documents
            # and would cut the sequence at every swap; an explicit all-ones mask keeps it causal,
            # marked as such so that transformers drops it without reading the device (rpt.model.no_padding_mask).
            attention_mask = no_padding_mask(input_ids.shape, input_ids.device)
        model_inputs = dict(inputs_embeds=inputs_embeds, position_ids=position_ids, attention_mask=attention_mask,
                            past_key_values=past_key_values, use_cache=use_cache, **kwargs)
        if labels is None:
            out = self.lm(**model_inputs)
            return _output(out, logits=out.logits)
        # With labels: the body's hidden states, then the head and the cross-entropy a tile of
        # logits at a time (rpt.model.loss), so no [batch, seq, vocab] float32 tensor ever exists.
        out = self.lm.base_model(**model_inputs)
        hidden = out.last_hidden_state
        head = self.lm.get_output_embeddings()
        scale, softcap = self.logit_transform()
        flat = hidden.reshape(-1, hidden.shape[-1])
        per_token = linear_cross_entropy(
            flat, head.weight, getattr(head, "bias", None), labels.reshape(-1),
            plan_blocks(flat.shape[0], self.lm.config.vocab_size, self.loss_chunk_bytes), scale=scale, softcap=softcap,
        )
        loss, ntp, ptp, sums, counts = split_losses(per_token.view_as(labels), labels, kinds, self.window)
        return _output(out, loss=loss, ntp_loss=ntp, ptp_loss=ptp, kind_loss_sum=sums, kind_count=counts)

    def logit_transform(self) -> tuple[float | None, float | None]:
        """``(scale, softcap)`` the base model applies after its output embedding: Cohere's
        ``logit_scale``, Granite's ``1 / logits_scaling``, Gemma 2/3's ``final_logit_softcapping``."""
        config = self.lm.config
        scale = None
        if getattr(config, "model_type", "").startswith("cohere") and getattr(config, "logit_scale", None):
            scale = float(config.logit_scale)
        if getattr(config, "logits_scaling", None):
            scale = 1.0 / float(config.logits_scaling)
        cap = getattr(config, "final_logit_softcapping", None)
        return scale, float(cap) if cap else None
