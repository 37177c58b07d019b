r"""The decode's model call for Llama-shaped models, as the fast decoders build it (gpt-fast's
``Transformer``): fused projections, grouped-query attention on the position-addressed cache, no mask
tensor where the kernel can take the rule instead.

Per layer four weight GEMMs instead of seven -- ``[Wq; Wk; Wv]`` and ``[W_gate; W_up]`` stacked in a
copy the decode owns (:mod:`rpt.decode_forward.fused_weights`: the model's tensors are only read; the copy
costs about half the model's weight bytes and is refilled from the parameters at every decode) -- and
attention reading the cache's ``kv_heads`` K/V directly (``enable_gqa``: no ``repeat_kv`` copy of K
and V per layer). What a query sees is :func:`rpt.decode_forward.visibility.visible`, eq. 4's rule:

* inside a compiled call on CUDA (:data:`FLEX_DEVICES`) the rule is flex attention's ``score_mod``,
  evaluated inside the kernel: no ``[batch, 1, Q, capacity]`` mask is built or read, and the flash-style
  decoding kernel runs (a boolean mask rules out sdpa's flash kernel, and with GQA its efficient one);
* elsewhere (every eager call; compiled calls on the CPU, where inductor's flex kernel is slower than
  sdpa's) the same rule builds a boolean mask for ``scaled_dot_product_attention(enable_gqa=True)``, or
  none at all for a plain call.

The eager and the compiled decode run this one function; the rest of the step is Hugging Face's own
modules (the RMSNorms, the rotary embedding, ``o_proj``, ``down_proj``, the head), so the logits are
the model's forward up to float rounding. Only architectures whose layers are exactly that shape are
taken (:data:`ARCHITECTURES`, checked module by module: :func:`unsupported`); anything else -- GPT-2's
``c_attn``, sliding windows, q/k norms, LoRA-wrapped projections, sharded parameters, and any forward
hook or patched ``forward`` on any module of the model (the RPT wrapper included) or a global module
hook -- keeps the model's own forward, which runs them.

**What the fused call follows** (:meth:`DecodeModel.current`, checked at the start of every decode and
before every call of a :class:`~rpt.decode_forward.queries.ModelQueries` used directly, and the weights
refilled once per decode: :meth:`DecodeModel.sync`): every submodule of the model in its
place (a module replaced anywhere -- the head, the final norm, a projection, an adapter injected --
builds the call anew from the model as it is), no hook anywhere, the config keys the check above
reads, the attention attributes Hugging Face reads per call (``layer_idx``, ``head_dim``,
``scaling``: read by the call itself too, so a compiled call re-traces on a changed value), and the
stacked weights' sources by their fingerprint (:class:`~rpt.decode_forward.fused_weights.FusedGroup`).
"""

from __future__ import annotations

import importlib
import threading

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from rpt.decode_forward.fused_weights import FusedGroup
from rpt.decode_forward.visibility import Visibility, visibility_mask, visible

try:  # torch >= 2.5; guarded for older installs (then the sdpa kernel runs everywhere)
    from torch.nn.attention.flex_attention import flex_attention
except ImportError:  # pragma: no cover
    flex_attention = None

# causal LM class -> the modeling module whose layer classes it must be made of (each a Llama layer:
# pre-norm RMSNorm, rotary q/k, a gated MLP; Qwen2 adds q/k/v biases, which are fused too)
ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"}
_PREFIX = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}
# device types whose compiled calls attend with flex attention (a test adds "cpu" to run that path here),
# in the dtypes its kernels are written for (float64 decodes -- the exactness tests' -- keep sdpa)
FLEX_DEVICES = {"cuda"}
FLEX_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_ATTRIBUTE = "_rpt_fused_layers"  # on the HF model: its FusedLayers (not a submodule, parameter or buffer)
_LOCK = threading.RLock()  # building and refilling the stacked copies: one thread at a time (fused_layers)


def base_of(model) -> nn.Module:
    """The Hugging Face model of ``model`` (an :class:`~rpt.model.RPTForCausalLM` wraps one as ``lm``)."""
    return model.lm if hasattr(model, "offset_embedding") else model


def _layer_classes(kind: str) -> tuple:
    module = importlib.import_module(f"transformers.models.{kind}.modeling_{kind}")
    return tuple(getattr(module, _PREFIX[kind] + name) for name in ("DecoderLayer", "Attention", "MLP", "RMSNorm"))


def _linear(module) -> bool:
    return type(module) is nn.Linear  # a PEFT / quantised wrapper computes something else


def _config_key(config) -> tuple:
    """The config values :func:`unsupported` decides from (a change is checked again before the next call)."""
    rope = (getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    return (getattr(config, "sliding_window", None), tuple(getattr(config, "layer_types", None) or ()),
            rope.get("rope_type", rope.get("type", "default")), getattr(config, "attention_dropout", 0.0),
            config.num_hidden_layers)


def _global_hooks() -> bool:
    """Whether a global module forward hook is registered (``torch.nn.modules.module.register_module_forward_hook``)."""
    from torch.nn.modules import module

    return bool(module._global_forward_hooks or module._global_forward_pre_hooks)


def unsupported(lm, model=None) -> str | None:
    """Why the fused call cannot stand in for ``lm``'s forward (None: it can); ``model``: what is called, an
    RPT wrapper of ``lm`` (its hooks count too; default ``lm``)."""
    kind = ARCHITECTURES.get(type(lm).__name__)
    if kind is None:
        return f"{type(lm).__name__} is not one of the Llama-shaped architectures {sorted(ARCHITECTURES)}"
    layer_cls, attn_cls, mlp_cls, norm_cls = _layer_classes(kind)
    config = lm.config
    if getattr(config, "sliding_window", None) is not None and kind == "mistral":
        return "sliding-window attention"
    if any(t != "full_attention" for t in (getattr(config, "layer_types", None) or [])):
        return "layers other than full attention"
    rope = (getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    if rope.get("rope_type", rope.get("type", "default")) in ("dynamic", "longrope"):
        return "a RoPE that rescales with the sequence length (a host read per call)"
    if getattr(config, "attention_dropout", 0.0):
        return "attention dropout"
    body = lm.model
    if type(body.norm) is not norm_cls or not _linear(lm.lm_head) or lm.lm_head.bias is not None:
        return "an unexpected final norm or output head"
    for layer in body.layers[: config.num_hidden_layers]:
        attn, mlp = layer.self_attn, layer.mlp
        if (type(layer) is not layer_cls or type(attn) is not attn_cls or type(mlp) is not mlp_cls
                or type(layer.input_layernorm) is not norm_cls or type(layer.post_attention_layernorm) is not norm_cls):
            return f"layer {attn.layer_idx if hasattr(attn, 'layer_idx') else '?'} is not a plain {kind} layer"
        if not all(_linear(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj,
                                         mlp.up_proj, mlp.down_proj)):
            return "a projection is not a plain nn.Linear (an adapter or quantisation wraps it)"
        if getattr(attn, "sliding_window", None) is not None:
            return "sliding-window attention"
        if len({m.bias is None for m in (attn.q_proj, attn.k_proj, attn.v_proj)}) > 1 or \
                len({m.bias is None for m in (mlp.gate_proj, mlp.up_proj)}) > 1:
            return "biases on some of the fused projections only"
    for module in (model if model is not None else lm).modules():  # the fused call does not run them
        if not _plain(module):
            return f"a forward hook or patched forward on {type(module).__name__}"
    if _global_hooks():
        return "a global module forward hook"
    return None


def _plain(module: nn.Module) -> bool:
    """No forward hook and no patched ``forward`` (accelerate's offloading hooks patch it)."""
    return not (module._forward_hooks or module._forward_pre_hooks or "forward" in module.__dict__)


class _Layer:
    """One decoder layer's modules and fused groups."""

    def __init__(self, layer: nn.Module):
        attn, mlp = layer.self_attn, layer.mlp
        self.layer, self.attn, self.mlp = layer, attn, mlp
        self.qkv = FusedGroup([(attn.q_proj, "weight"), (attn.k_proj, "weight"), (attn.v_proj, "weight")])
        self.qkv_bias = None if attn.q_proj.bias is None else \
            FusedGroup([(attn.q_proj, "bias"), (attn.k_proj, "bias"), (attn.v_proj, "bias")])
        self.gate_up = FusedGroup([(mlp.gate_proj, "weight"), (mlp.up_proj, "weight")])
        self.gate_up_bias = None if mlp.gate_proj.bias is None else \
            FusedGroup([(mlp.gate_proj, "bias"), (mlp.up_proj, "bias")])
        self.groups = [g for g in (self.qkv, self.qkv_bias, self.gate_up, self.gate_up_bias) if g is not None]

    def attributes(self) -> tuple:
        """The attention's attributes Hugging Face reads per call, which the fused call reads too."""
        return self.attn.layer_idx, self.attn.head_dim, self.attn.scaling

    def heads(self) -> tuple[int, int]:
        """(query heads, KV heads), from the stacked copy's rows."""
        q, k = self.qkv.sizes[:2]
        return q // self.attn.head_dim, k // self.attn.head_dim


class FusedLayers:
    """Every layer's fused groups, kept on the HF model (so an RPT wrapper and its bare model share them)."""

    def __init__(self, lm: nn.Module):
        self.layer_list = lm.model.layers
        self.count = lm.config.num_hidden_layers
        self.layers = [_Layer(layer) for layer in lm.model.layers[: self.count]]

    def same_structure(self, lm) -> bool:
        """Whether ``lm``'s layers are still the modules these groups stack the weights of."""
        if lm.model.layers is not self.layer_list or lm.config.num_hidden_layers != self.count:
            return False
        for layer, fused in zip(self.layer_list, self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            if (layer is not fused.layer or attn is not fused.attn or mlp is not fused.mlp
                    or [m for m, _ in fused.qkv.slots] != [attn.q_proj, attn.k_proj, attn.v_proj]
                    or [m for m, _ in fused.gate_up.slots] != [mlp.gate_proj, mlp.up_proj]):
                return False
        return True

    def current(self) -> bool:
        return all(g.current() for layer in self.layers for g in layer.groups)

    def refresh(self, force: bool = False) -> bool:
        """Refill every group whose sources changed (every group with ``force``); False where one cannot be."""
        return all(g.refresh(force) for layer in self.layers for g in layer.groups)


def fused_layers(lm: nn.Module, model=None, force: bool = False) -> FusedLayers | None:
    """``lm``'s fused layers, filled from its current parameters (None: the fused call cannot run it; ``model``:
    the RPT wrapper called, whose hooks count too). One thread at a time: two decodes starting together
    on a fresh model would otherwise both build the copies."""
    with _LOCK:
        if unsupported(lm, model) is not None:
            lm.__dict__.pop(_ATTRIBUTE, None)  # the copies go with the fused call (an adapter merged later is read anew)
            return None
        fused = lm.__dict__.get(_ATTRIBUTE)
        if fused is None or not fused.same_structure(lm):
            fused = lm.__dict__[_ATTRIBUTE] = FusedLayers(lm)
        try:
            ready = fused.refresh(force)
        except torch.OutOfMemoryError:  # no room for the copies: the model's own forward runs
            ready = False
        if not ready:
            lm.__dict__.pop(_ATTRIBUTE, None)
        return fused if ready else None


def release_fused_weights(lm: nn.Module, unshare: bool = False) -> None:
    """Free ``lm``'s stacked copies now (the next fused decode builds them again). The model's parameters
    are never changed by them; ``unshare`` is accepted and does nothing (no parameter shares storage with
    the copies)."""
    with _LOCK:
        lm.__dict__.pop(_ATTRIBUTE, None)


def _structure(model: nn.Module) -> list[tuple[dict, str, nn.Module]]:
    """Every submodule of ``model`` in its parent's table: (table, name, module)."""
    return [(parent._modules, name, child) for parent in model.modules() for name, child in parent._modules.items()
            if child is not None]


class DecodeModel:
    """``call(cache, ids, positions, offsets, vis, columns, keep, plain)``: the logits of a decode call.

    ``model``: an :class:`~rpt.model.RPTForCausalLM` (token + offset embeddings) or its bare HF model.
    Build with :meth:`for_model` (None where the fused call cannot stand in for the model's forward).
    """

    def __init__(self, model, lm: nn.Module, fused: FusedLayers):
        self.model, self.lm, self.fused = model, lm, fused
        self.takes_offsets = lm is not model
        self.layers = fused.layers
        self.rotary, self.norm, self.head = lm.model.rotary_emb, lm.model.norm, lm.lm_head
        self._structure = _structure(model)
        self._modules = [model, *(m for _, _, m in self._structure)]
        self._config = _config_key(lm.config)
        self._attributes = [layer.attributes() for layer in self.layers]

    @classmethod
    def for_model(cls, model, force: bool = False) -> DecodeModel | None:
        """The fused call for ``model`` as it is now (None: it cannot run it); ``force``: refill the copies
        from the parameters even where their fingerprint is unchanged (what a decode's start does)."""
        lm = base_of(model)
        fused = fused_layers(lm, model, force)
        return None if fused is None else cls(model, lm, fused)

    def current(self) -> bool:
        """Whether the fused call still computes the model's forward: every submodule in its place, no hook
        anywhere, the config and attention attributes it was built on, the copies' sources unchanged by
        their fingerprint (an in-place write through ``p.data`` is not: :meth:`sync` refills anyway)."""
        return (all(table.get(name) is module for table, name, module in self._structure)
                and all(_plain(m) for m in self._modules) and not _global_hooks()
                and _config_key(self.lm.config) == self._config
                and all(layer.attributes() == seen for layer, seen in zip(self.layers, self._attributes))
                and self.fused.current() and self.lm.__dict__.get(_ATTRIBUTE) is self.fused)

    def sync(self) -> bool:
        """Refill the copies from the parameters (a decode's start: module docstring); False where the fused
        call no longer fits the model (the caller builds anew)."""
        if not self.current():
            return False
        with _LOCK:
            return self.fused.refresh(force=True)

    def allocate(self, cache, batch: int, device) -> None:
        """Allocate ``cache``'s KV for ``batch`` rows before a first call (a compiled one then traces no
        allocation, and the first decode of a bucket compiles its prefill too)."""
        dtype = self.lm.get_input_embeddings().weight.dtype
        for layer in self.layers:
            index, d, _ = layer.attributes()
            cache.layers[index].allocate(batch, layer.heads()[1], d, d, dtype, device)

    def embed(self, ids: torch.Tensor, offsets: torch.Tensor | None) -> torch.Tensor:
        if self.takes_offsets:
            return self.model.embed(ids, offsets, check=False)  # in range: the decoder built them
        return self.lm.get_input_embeddings()(ids)

    def __call__(self, cache, ids: torch.Tensor, positions: torch.Tensor, offsets: torch.Tensor | None,
                 vis: Visibility, columns: torch.Tensor, keep=None, plain: bool = False) -> torch.Tensor:
        """Logits ``[batch, K, V]`` of the queries ``keep`` selects (int: the last K; tensor: indices; None:
        all); each query's K/V written at ``columns`` of ``cache`` (:class:`~rpt.decode_forward.kv_cache.PositionKVCache`,
        its ``columns`` / ``kv_len`` set by the caller); ``plain``: no mask (every column below kv_len)."""
        h = self.embed(ids, offsets)
        batch, q = ids.shape
        cos, sin = self.rotary(h, positions)
        attend = _attention(vis, columns, batch, h, cache.kv_len, plain)
        for layer in self.layers:
            x = layer.layer.input_layernorm(h)
            qkv = F.linear(x, layer.qkv.tensor, None if layer.qkv_bias is None else layer.qkv_bias.tensor)
            index, d, scaling = layer.attributes()  # read as HF's attention reads them: per call
            heads, kv_heads = layer.heads()
            qs, ks, vs = qkv.split([heads * d, kv_heads * d, kv_heads * d], -1)
            qs = qs.view(batch, q, heads, d).transpose(1, 2)
            ks = ks.view(batch, q, kv_heads, d).transpose(1, 2)
            vs = vs.view(batch, q, kv_heads, d).transpose(1, 2)
            qs, ks = apply_rotary_pos_emb(qs, ks, cos, sin)
            keys, values = cache.layers[index].update(ks, vs)
            out = attend(qs, keys, values, scaling)
            h = h + layer.attn.o_proj(out.transpose(1, 2).reshape(batch, q, heads * d))
            x = layer.layer.post_attention_layernorm(h)
            gate_up = F.linear(x, layer.gate_up.tensor, None if layer.gate_up_bias is None else layer.gate_up_bias.tensor)
            gate, up = gate_up.chunk(2, -1)
            h = h + layer.mlp.down_proj(layer.mlp.act_fn(gate) * up)
        if keep is not None:  # the norm and the head only where logits are kept (both are per position)
            h = h[:, -keep:] if isinstance(keep, int) else h[:, keep]
        return self.head(self.norm(h))


def _attention(vis: Visibility, columns: torch.Tensor, batch: int, like: torch.Tensor, kv_len: int, plain: bool):
    """``attend(q, keys, values, scale)`` for one call (its queries' device and dtype those of ``like``): the
    rule of :func:`~rpt.decode_forward.visibility.visible` as flex attention's ``score_mod`` (compiled, on
    :data:`FLEX_DEVICES` in :data:`FLEX_DTYPES`) or as one boolean mask (built once per call, shared by the
    layers), with the cache's KV heads as they are (``enable_gqa``)."""
    if (flex_attention is not None and like.device.type in FLEX_DEVICES and like.dtype in FLEX_DTYPES
            and torch.compiler.is_compiling()):
        if vis.limit.dim() == 2 and vis.limit.shape[0] != batch:  # score_mod indexes the limit by row
            vis = Visibility(vis.limit.expand(batch, -1), vis.start, vis.since)

        def score_mod(score, b, h, q, key):
            return torch.where(visible(vis, columns, b, q, key), score, -float("inf"))

        def flex(q, keys, values, scale):
            return flex_attention(q, keys, values, score_mod=score_mod, scale=scale, enable_gqa=True)

        return flex
    mask = None if plain else visibility_mask(vis, columns, kv_len)[:, None]

    def sdpa(q, keys, values, scale):
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale, enable_gqa=True)

    return sdpa
