"""Tiny random configs of the Hugging Face causal-LM families the wrapper is tested on (no download).

Each entry is ``name -> (model_type, config kwargs)``: two layers, hidden size 32, 4 heads (2 KV
heads where the family has grouped queries), vocabulary :data:`VOCAB`, weights at a larger scale
than the default init so that greedy decoding does not collapse onto one token.
"""

from __future__ import annotations

import torch
from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, AutoConfig, AutoModelForCausalLM, PreTrainedModel

VOCAB = 97
# the common shape, in each family's own key names below where they differ
_LLAMA_LIKE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=256)
_GEMMA_LIKE = dict(_LLAMA_LIKE, head_dim=8)  # Gemma's default head_dim (256) is not hidden / heads
_GPT2_LIKE = dict(n_embd=32, n_layer=2, n_head=4, n_positions=256)

ZOO: dict[str, tuple[str, dict]] = {
    "llama": ("llama", _LLAMA_LIKE),
    "qwen2": ("qwen2", _LLAMA_LIKE),
    "qwen3": ("qwen3", dict(_LLAMA_LIKE, head_dim=8)),
    "mistral": ("mistral", _LLAMA_LIKE),
    "mixtral": ("mixtral", dict(_LLAMA_LIKE, num_local_experts=4, num_experts_per_tok=2)),
    "phi": ("phi", dict(_LLAMA_LIKE, num_key_value_heads=4)),
    "phi3": ("phi3", _LLAMA_LIKE),
    "gpt_neox": ("gpt_neox", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  max_position_embeddings=256)),
    "olmo2": ("olmo2", _LLAMA_LIKE),
    "granite": ("granite", dict(_LLAMA_LIKE, embedding_multiplier=2.0, logits_scaling=4.0)),
    "stablelm": ("stablelm", _LLAMA_LIKE),
    "starcoder2": ("starcoder2", _LLAMA_LIKE),
    "cohere": ("cohere", dict(_LLAMA_LIKE, logit_scale=0.5)),
    "smollm3": ("smollm3", _LLAMA_LIKE),
    "gpt2": ("gpt2", _GPT2_LIKE),
    "gpt_bigcode": ("gpt_bigcode", _GPT2_LIKE),
    "gptj": ("gptj", dict(_GPT2_LIKE, rotary_dim=4)),
    "opt": ("opt", dict(hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4, word_embed_proj_dim=32,
                        max_position_embeddings=256)),
    "falcon": ("falcon", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=256)),
    "gemma": ("gemma", _GEMMA_LIKE),
    "gemma2": ("gemma2", dict(_GEMMA_LIKE, final_logit_softcapping=3.0)),
    "gemma3_text": ("gemma3_text", dict(_GEMMA_LIKE, final_logit_softcapping=3.0)),
    # variants whose path differs inside a family: OPT-350m's projected embedding, Falcon-40B's decoder,
    # Gemma 3's interleaved sliding / full attention layers
    "opt_projected": ("opt", dict(hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                                  word_embed_proj_dim=16, max_position_embeddings=256)),
    "falcon_new_decoder": ("falcon", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_kv_heads=2,
                                          new_decoder_architecture=True, max_position_embeddings=256)),
    "gemma3_interleaved": ("gemma3_text", dict(_GEMMA_LIKE, sliding_window=64,
                                               layer_types=["sliding_attention", "full_attention"])),
    # ALiBi: attention biases from token distances, no position ids (refused by RPTForCausalLM.from_base)
    "bloom": ("bloom", dict(hidden_size=32, n_layer=2, n_head=4)),
    "mpt": ("mpt", dict(d_model=32, n_layers=2, n_heads=4, max_seq_len=256)),
    "falcon_alibi": ("falcon", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, alibi=True)),
}

ALIBI = ("bloom", "mpt", "falcon_alibi")
# std of the noise added to each layer's 1-D parameters (norm weights, biases); Gemma 2 / 3 normalise
# every sublayer's output, so their sublayers need large norm weights to outweigh the scaled embedding
SPREAD = {"gemma2": 10.0, "gemma3_text": 10.0, "gemma3_interleaved": 10.0}


def tiny_config(name: str, attn: str = "sdpa"):
    model_type, kwargs = ZOO[name]
    # token ids inside the tiny vocabulary (several families default to ids of their real tokenizers)
    config = AutoConfig.for_model(model_type, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                  initializer_range=0.5, **kwargs)
    if attn == "sdpa" and not MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]._supports_sdpa:
        attn = "eager"  # GPT-J, Gemma 2, BLOOM, MPT: transformers has no sdpa path for them
    config._attn_implementation = attn
    if getattr(config, "num_local_experts", None):
        config._experts_implementation = "eager"  # the grouped-GEMM experts refuse float64
    return config


def tiny_model(name: str, seed: int = 0, attn: str = "sdpa") -> PreTrainedModel:
    """A random ``name`` model in eval mode (``attn``: the attention implementation, eager where the
    family has no sdpa)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(name, attn)).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param_name, p in model.named_parameters():
            if p.dim() == 1 and (".h." in param_name or "layers" in param_name or "blocks" in param_name):
                p.add_(SPREAD.get(name, 1.0) * torch.randn(p.shape, generator=g))
    return model
