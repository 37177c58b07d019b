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


CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for i in range(10):\n    print(i * i)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "The quick brown fox jumps over the lazy dog.\n",
]


def tiny_tokenizer(vocab_size: int = 300):
    """A byte-level BPE trained here on a few lines of code (no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def save_tiny_checkpoint(path, window: int = 3, seed: int = 0) -> str:
    """A random RPT checkpoint (random offset table, so PTP differs from NTP) with its tokenizer."""
    from rpt.model import RPTForCausalLM

    tokenizer = tiny_tokenizer()
    model = RPTForCausalLM.from_base(tiny_llama(vocab_size=len(tokenizer), seed=seed, initializer_range=0.4), window)
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        model.offset_embedding.weight.copy_(0.3 * torch.randn(model.offset_embedding.weight.shape, generator=g))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)
