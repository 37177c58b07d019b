"""Tiny tokenizers and checkpoints with a chat template (built here, no download), for the ``--chat`` tests."""

from __future__ import annotations

from pathlib import Path

# ChatML-like, spelled with ordinary text and the tiny tokenizer's one special token, so the tiny
# models' vocabulary covers it.
CHAT_TEMPLATE = ("{{ bos_token if bos_token else '' }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}"
                 "<|endoftext|>\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def chat_tokenizer(bos: bool = False):
    """``tests.helpers.tiny_models.tiny_tokenizer`` with :data:`CHAT_TEMPLATE`; ``bos=True``: a tokenizer that
    adds a BOS token to every encoding, whose template writes BOS too (as Llama 3's does)."""
    from tokenizers import processors

    from tests.helpers.tiny_models import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    if bos:
        tokenizer.bos_token = "<|endoftext|>"
        bos_id = tokenizer.bos_token_id
        tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single="<|endoftext|> $A", pair="<|endoftext|> $A <|endoftext|> $B", special_tokens=[("<|endoftext|>", bos_id)])
    return tokenizer


def add_chat_template(checkpoint: str | Path) -> str:
    """Give a saved tiny checkpoint's tokenizer :data:`CHAT_TEMPLATE` (the weights stay as they are)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(checkpoint)
    return str(checkpoint)
