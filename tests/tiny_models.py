"""Tiny models built from configs (no download) shared by the tests."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM


def tiny_llama(vocab_size: int = 97, seed: int = 0, attn: str = "sdpa", **kw) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, **kw,
    )
    cfg._attn_implementation = attn
    return LlamaForCausalLM(cfg).eval()


def tiny_gpt2(vocab_size: int = 97, seed: int = 0, attn: str = "sdpa") -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=2, n_head=4, n_positions=256)
    cfg._attn_implementation = attn
    return GPT2LMHeadModel(cfg).eval()
