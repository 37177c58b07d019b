"""What the benchmarks ask an instruction-tuned model under ``--chat``, and how its reply is read.

Code (HumanEval(+), MBPP+): EvalPlus's convention for chat models (``evalplus.codegen`` and
``evalplus.provider.utility.make_raw_chat_prompt``, v0.3.1). The user turn is an instruction and the
task's prompt in a code block; the reply is started for the model with a sentence and an opening
```` ```python ```` fence; generation stops at the closing fence (``"\\n```\\n"``) or EvalPlus's end
markers; the program is the reply's code cut down by ``evalplus.sanitize`` to the entry point and
what it needs (imports, helpers). It runs alone, without the task's prompt: the samples file holds it
as ``solution``, as EvalPlus's does.

GSM8K: the shots as earlier turns (user ``Question: ...\\nAnswer:``, assistant the worked answer),
then the test question, as lm-eval's ``--apply_chat_template --fewshot_as_multiturn``; the reply is
read like a base model's answer.
"""

from __future__ import annotations

from collections.abc import Sequence

from rpt.evaluation.user_jsonl import EvalInputError

# evalplus.codegen.run_codegen's defaults (no "perf"/"cot" variant).
INSTRUCTION = ("Please provide a self-contained Python script that solves the following problem in a markdown "
               "code block:")
RESPONSE = ("Below is a Python script with a self-contained function that solves the problem and passes "
            "corresponding tests:")
# evalplus.provider.utility.EOS, plus the closing fence evalplus.provider.hf adds for chat models.
CODE_STOP = ("<|endoftext|>", "<|endofmask|>", "</s>", "\nif __name__", "\ndef main(", "\nprint(", "\n```\n")


def code_turns(task_prompt: str) -> tuple[list[dict], str]:
    """``(messages, reply_prefix)`` of a code task, as ``make_raw_chat_prompt`` builds them."""
    user = f"{INSTRUCTION}\n```\n{task_prompt.strip()}\n```\n"
    return [{"role": "user", "content": user}], f"{RESPONSE}\n```python\n"


def solution_from_reply(reply: str, entry_point: str) -> str:
    """The program of a chat reply: ``evalplus.sanitize`` (the entry point, its dependencies, imports)."""
    try:
        from evalplus.sanitize import sanitize
    except ImportError as exc:
        raise EvalInputError(f"--chat on the code benchmarks reads replies with evalplus.sanitize ({exc}); "
                             "install it with pip install -e '.[evalplus]'") from None
    return sanitize(reply, entrypoint=entry_point)


def gsm8k_turns(shots: Sequence[tuple[str, str]], question: str) -> list[dict]:
    """Few-shot as multi-turn: ``shots`` are ``(user, assistant)`` texts, then the open ``question``."""
    turns = []
    for user, assistant in shots:
        turns += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return [*turns, {"role": "user", "content": question}]
