"""Prompts for instruction-tuned (chat) models: ``--chat`` in ``sample.py`` and the evaluation scripts.

A prompt becomes the tokenizer's chat template applied to its messages with
``add_generation_prompt=True`` (``tokenizer.apply_chat_template``), as text, optionally followed by
the start of the model's reply (``reply_prefix``, e.g. EvalPlus's "Below is a Python script ...
```python"). The text is then tokenized like any prompt; a template that writes the BOS token itself
would get a second one from a tokenizer that adds BOS, so :func:`render` drops the template's
(the token ids equal ``apply_chat_template(..., tokenize=True)``). A tokenizer without a chat
template is refused (:func:`require_chat_template`): base models take plain prompts.

A template is code from the checkpoint's files, so every way it can fail is one
:class:`ChatTemplateError` line naming the tokenizer, the template (its file, the template's name
where the tokenizer has several, the template line) and jinja's message: a template that raises,
a syntax error, a template that is not a string, an ``{% include %}`` (no loader in the sandbox),
and an access jinja's sandbox blocks. The last one jinja itself renders as an empty string and
goes on; here it is an error, so no prompt is ever built from a template half applied.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from rpt.errors import ChatTemplateError

CHAT_HELP = ("apply the tokenizer's chat template (add_generation_prompt=True) to each prompt, for "
             "instruction-tuned models; refused where the tokenizer has none")
# The conversation require_chat_template renders before any model loads: one user turn.
PROBE = ({"role": "user", "content": "Hello"},)
# Where transformers reads a tokenizer's chat template from, in the order it prefers them.
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")


def add_chat_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup, help_text: str = CHAT_HELP) -> None:
    parser.add_argument("--chat", action="store_true", help=help_text)


def require_chat_template(tokenizer, checkpoint: str, probes: Sequence[Sequence[dict]] = (PROBE,),
                          flag: str = "--chat") -> None:
    """``ValueError`` (one line) when ``tokenizer`` has no chat template, and :class:`ChatTemplateError`
    when it fails on any of ``probes`` (conversations rendered here, before a model loads)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{flag} needs a chat template, and the tokenizer of {checkpoint} has none "
                         f"(tokenizer.chat_template is unset); drop {flag} to prompt it as a base model, or use an "
                         "instruction-tuned checkpoint")
    for messages in probes:
        render(tokenizer, messages)


def _adds_bos(tokenizer) -> bool:
    bos = tokenizer.bos_token_id
    return bos is not None and tokenizer("x")["input_ids"][:1] == [bos]


def render(tokenizer, messages: Sequence[dict], reply_prefix: str = "", add_generation_prompt: bool = True) -> str:
    """The prompt text of ``messages`` (``[{"role", "content"}]``) with the generation prompt, then
    ``reply_prefix``; ``add_generation_prompt=False`` continues the last (assistant) message instead.
    Any failure of the template is a :class:`ChatTemplateError`."""
    template = template_text(tokenizer)
    try:
        _refuse_blocked_access(template)
        text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=add_generation_prompt,
                                             continue_final_message=not add_generation_prompt)
    except Exception as exc:  # the template is the checkpoint's code: whatever it raises is its failure
        raise ChatTemplateError(_describe(tokenizer, exc)) from None
    if not isinstance(text, str):
        raise ChatTemplateError(f"{_where(tokenizer)} rendered a {type(text).__name__}, not text")
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and _adds_bos(tokenizer):
        text = text[len(bos):]  # tokenizing the text adds BOS again: keep one
    return text + reply_prefix


def user_prompt(tokenizer, text: str) -> str:
    """One user turn ``text`` as a chat prompt (``sample.py --chat``)."""
    return render(tokenizer, [{"role": "user", "content": text}])


# ---- what a failure says --------------------------------------------------------------------------
def template_source(tokenizer) -> str:
    """Where the tokenizer's chat template was read from: the file in its folder, else its name."""
    folder = str(getattr(tokenizer, "name_or_path", "") or "")
    for name in TEMPLATE_FILES:
        path = os.path.join(folder, name)
        if folder and os.path.isfile(path):
            return path
    return f"tokenizer.chat_template of {folder or type(tokenizer).__name__}"


def _where(tokenizer) -> str:
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    template = getattr(tokenizer, "chat_template", None)
    which = " (its template 'default')" if isinstance(template, dict) else ""
    return f"the chat template of tokenizer {name!r}{which}, from {template_source(tokenizer)},"


def template_text(tokenizer) -> str:
    """The template that will run: a string, or the ``default`` of a named set of strings."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        if "default" not in template:
            raise ChatTemplateError(f"{_where(tokenizer)} is a set of named templates {sorted(map(str, template))} "
                                    "without a 'default' one; name one of them 'default'")
        template = template["default"]
    if not isinstance(template, str):
        kind = type(template).__name__
        raise ChatTemplateError(f"{_where(tokenizer)} is {'an' if kind[0] in 'aeiou' else 'a'} {kind}, not a string of "
                                "jinja source; fix the chat_template entry")
    return template


def _describe(tokenizer, exc: Exception) -> str:
    message = " ".join(str(exc).split()) or "(no message)"
    line = _template_line(exc)
    at = f" at template line {line}" if line is not None else ""
    kind = type(exc).__name__
    hint = ("jinja's sandbox has no loader: inline the included template" if kind == "TypeError" and "loader" in message
            else "fix the template (or pass a checkpoint whose template works), or drop --chat")
    return f"{_where(tokenizer)} failed{at}: {kind}: {message}; {hint}"


def _template_line(exc: Exception) -> int | None:
    """The template line a jinja error points at: its own ``lineno`` (syntax errors), else the last
    frame of the rendered template in the traceback (jinja rewrites them to ``<template>`` lines)."""
    line = getattr(exc, "lineno", None)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _refuse_blocked_access(template: str) -> None:
    """Make jinja's sandbox raise where it would render a blocked access as an empty string.

    transformers compiles each template once (an ``lru_cache`` on the string) in its own
    ``ImmutableSandboxedEnvironment``; that environment answers an unsafe attribute
    (``messages.__class__``, ``messages.append`` without a call) with an undefined value that prints
    as nothing, so the prompt would be the template with holes. Its ``unsafe_undefined`` is replaced
    on that one environment by a function that raises jinja's ``SecurityError`` instead. Where the
    installed transformers compiles differently, this does nothing (tests/sampling/test_chat.py pins it).
    """
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:  # pragma: no cover - depends on the installed transformers
        return
    environment = _compile_jinja_template(template).environment
    if getattr(environment, "unsafe_undefined", None) is not _raise_unsafe:
        environment.unsafe_undefined = _raise_unsafe


def _raise_unsafe(obj, attribute):
    from jinja2.exceptions import SecurityError

    raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe "
                        "(blocked by jinja's sandbox)")


def template_file_problem(folder: str) -> str | None:
    """Why the chat template files of a tokenizer ``folder`` cannot be read, or None: a file that is
    not UTF-8, or a ``chat_template`` in ``tokenizer_config.json`` that is neither a string nor a list
    of ``{"name", "template"}`` strings (transformers fails on these while loading the tokenizer)."""
    import json

    if not os.path.isdir(folder):
        return None
    extra = os.path.join(folder, "additional_chat_templates")
    paths = [os.path.join(folder, n) for n in TEMPLATE_FILES]
    if os.path.isdir(extra):
        paths += sorted(os.path.join(extra, n) for n in os.listdir(extra))
    for path in paths:
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError as exc:
            return f"{path} is not UTF-8 text (byte {exc.start + 1}); save it as UTF-8"
        if os.path.basename(path) != "tokenizer_config.json":
            continue
        try:
            entry = json.loads(text).get("chat_template")
        except (json.JSONDecodeError, AttributeError):
            return None  # not ours to judge: transformers' own message stands
        if entry is None or isinstance(entry, str):
            continue
        if not isinstance(entry, list) or not all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                                  and isinstance(t.get("template"), str) for t in entry):
            return (f"{path}: chat_template must be a string of jinja source or a list of "
                    f"{{\"name\": ..., \"template\": ...}} strings, got {json.dumps(entry)[:80]}")
    return None
