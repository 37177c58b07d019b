"""Prompts for instruction-tuned (chat) models: ``--chat`` in ``sample.py`` and the evaluation scripts.

A prompt becomes the tokenizer's chat template applied to its messages with
``add_generation_prompt=True`` (``tokenizer.apply_chat_template``), as text, optionally followed by
the start of the model's reply (``reply_prefix``, e.g. EvalPlus's "Below is a Python script ...
```python"). The text is then tokenized like any prompt; a template that writes the BOS token itself
would get a second one from a tokenizer that adds BOS, so :func:`render` drops the template's
(the token ids equal ``apply_chat_template(..., tokenize=True)``). A tokenizer without a chat
template is refused (:func:`require_chat_template`): base models take plain prompts.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

CHAT_HELP = ("apply the tokenizer's chat template (add_generation_prompt=True) to each prompt, for "
             "instruction-tuned models; refused where the tokenizer has none")


def add_chat_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup, help_text: str = CHAT_HELP) -> None:
    parser.add_argument("--chat", action="store_true", help=help_text)


def require_chat_template(tokenizer, checkpoint: str) -> None:
    """``ValueError`` (one line) when ``tokenizer`` has no chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"--chat needs a chat template, and the tokenizer of {checkpoint} has none "
                         "(tokenizer.chat_template is unset); drop --chat to prompt it as a base model, or use an "
                         "instruction-tuned checkpoint")


def _adds_bos(tokenizer) -> bool:
    bos = tokenizer.bos_token_id
    return bos is not None and tokenizer("x")["input_ids"][:1] == [bos]


def render(tokenizer, messages: Sequence[dict], reply_prefix: str = "") -> str:
    """The prompt text of ``messages`` (``[{"role", "content"}]``) with the generation prompt, then ``reply_prefix``."""
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and _adds_bos(tokenizer):
        text = text[len(bos):]  # tokenizing the text adds BOS again: keep one
    return text + reply_prefix


def user_prompt(tokenizer, text: str) -> str:
    """One user turn ``text`` as a chat prompt (``sample.py --chat``)."""
    return render(tokenizer, [{"role": "user", "content": text}])
