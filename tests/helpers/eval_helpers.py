"""A tiny RPT checkpoint with a long context and a small GSM8K-like data folder, for the tests of the
evaluation front ends (lm-eval, Table 1). Random weights: scores are ~0, the tests check plumbing
and files."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tests.helpers.tiny_models import tiny_tokenizer


def long_context_checkpoint(path: Path, window: int = 3, seed: int = 0) -> str:
    """Like ``tests.helpers.tiny_models.save_tiny_checkpoint`` but with 4096 positions (benchmark prompts)."""
    from rpt.model import RPTForCausalLM

    tokenizer = tiny_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         initializer_range=0.4)
    model = RPTForCausalLM.from_base(LlamaForCausalLM(config).eval(), window)
    with torch.no_grad():
        model.offset_embedding.weight.copy_(0.3 * torch.randn(model.offset_embedding.weight.shape))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def gsm8k_folder(root: Path, n_train: int = 6, n_test: int = 5) -> Path:
    """``root/train.jsonl`` and ``root/test.jsonl`` of made-up word problems in GSM8K's format."""
    root.mkdir(parents=True, exist_ok=True)

    def row(i: int) -> dict:
        a, b = 3 + i, 4 + 2 * i
        return {"question": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
                "answer": f"Tom has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}"}

    for name, rows in (("train", range(n_train)), ("test", range(100, 100 + n_test))):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(row(i)) + "\n" for i in rows))
    return root
