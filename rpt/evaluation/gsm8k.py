"""GSM8K: data, the fixed k-shot chain-of-thought prompt, answer extraction and scoring.

Prompt format (``k`` train problems, then the test question)::

    Question: <q>
    Answer: <reasoning, calculator annotations removed> The answer is <N>.

    Question: <test q>
    Answer:

Generation stops at the next ``Question:``. Extraction takes the number after the last
``####`` or "The answer is", else the last number in the text, and compares numerically after
dropping ``$``, thousands separators, trailing zeros (``.0``/``.00``) and units.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path

from rpt.evaluation import chat_prompts
from rpt.evaluation import user_jsonl as jsonl
from rpt.evaluation.user_jsonl import EvalInputError, read_jsonl
from rpt.sampling.text import stopping

HUB_DATASET = ("openai/gsm8k", "main")
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SHOTS = 8
ANSWER_PHRASE = "The answer is"
# lm-eval-harness's stop set for GSM8K: the next few-shot question or an end-of-text marker.
STOP_SEQUENCES: tuple[str, ...] = ("Question:", "</s>", "<|im_end|>", "<|endoftext|>")

# Thousands groups only when well formed, so a list like "3,4,5" is not read as 345.
_NUMBER = r"-?\s?\$?\s?-?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?"
_MARKED = re.compile(r"(?:####|the\s+(?:final\s+)?answer\s+is)[:\s]*[^\d\n-]{0,40}?(" + _NUMBER + ")",
                     re.IGNORECASE)
_ANY_NUMBER = re.compile(_NUMBER)
_CALCULATOR = re.compile(r"<<[^>]*>>")


def local_copy(split: str = "test") -> Path | None:
    """``<split>.jsonl`` of the local GSM8K copy (``$RPT_GSM8K_DIR``, else ``../shared/data/gsm8k``
    beside the repository), or None where there is none."""
    folder = Path(os.environ.get("RPT_GSM8K_DIR") or ROOT.parent / "shared" / "data" / "gsm8k")
    path = folder / f"{split}.jsonl"
    return path if path.is_file() else None


def data_source(data: str | None, split: str = "test") -> str | None:
    """Where the ``--data`` flag's problems come from: the file given, else the local copy of
    ``split``, else None (the hub); ``--data hub`` asks for the hub."""
    if data == "hub":
        return None
    if data is not None:
        return data
    local = local_copy(split)
    return None if local is None else str(local)


def load_gsm8k(data: str | Path | None = None, split: str = "test") -> list[dict]:
    """Problems as ``{"question", "answer"}`` from a local JSONL, or from the hub if ``data`` is None.

    The hub path (``datasets.load_dataset("openai/gsm8k", "main")``) needs network or a warm
    cache; tests always pass a local file.
    """
    if data is not None:
        return read_jsonl(data, required=("question", "answer"), validate=_validate_problem)
    from datasets import load_dataset  # heavy import, only on the hub path

    try:
        dataset = load_dataset(*HUB_DATASET, split=split)
    except Exception as exc:  # offline, no cache, unknown split: one clear message, not a traceback
        raise EvalInputError(f"could not load {'/'.join(HUB_DATASET)} [{split}] from the hub "
                             f"({type(exc).__name__}: {exc}); pass --data FILE.jsonl") from exc
    return [{"question": row["question"], "answer": row["answer"]} for row in dataset]


def _validate_problem(obj: dict) -> None:
    for key in ("question", "answer"):
        if not isinstance(obj[key], str):
            raise ValueError(f"{key} must be a string, got {type(obj[key]).__name__}")
    if "####" not in obj["answer"]:
        raise ValueError("answer has no '#### N' final answer")


def gold_answer(answer: str) -> str:
    """The normalised number after ``####`` in a dataset answer."""
    value = extract_answer(answer.split("####")[-1]) if "####" in answer else None
    if value is None:
        raise EvalInputError(f"no final answer after '####' in {answer[-80:]!r}")
    return value


def chain_of_thought(answer: str) -> str:
    """Dataset answer -> few-shot style: calculator annotations dropped, ``The answer is N.``"""
    reasoning, _, final = answer.rpartition("####")
    reasoning = _CALCULATOR.sub("", reasoning).strip()
    return f"{reasoning}\n{ANSWER_PHRASE} {final.strip()}."


def format_example(question: str, answer: str | None = None) -> str:
    """One ``Question:/Answer:`` block; without ``answer`` it is the open generation prompt."""
    head = f"Question: {question.strip()}\nAnswer:"
    return head if answer is None else f"{head} {chain_of_thought(answer)}"


def fewshot_prefix(train: Sequence[dict], shots: int = DEFAULT_SHOTS) -> str:
    """The fixed k-shot prefix: the first ``shots`` train problems, always the same ones."""
    if shots > len(train):
        raise EvalInputError(f"asked for {shots} shots but the train split has {len(train)} problems")
    return "".join(format_example(p["question"], p["answer"]) + "\n\n" for p in train[:shots])


def build_prompt(prefix: str, question: str) -> str:
    """Few-shot prefix followed by the open question."""
    return prefix + format_example(question)


def gold_completion(answer: str) -> str:
    """What a perfect model would generate after ``Answer:`` (used by ``--completions gold``)."""
    return " " + chain_of_thought(answer)


def truncate_at_stop(text: str, stop_sequences: Sequence[str] = STOP_SEQUENCES) -> str:
    """Cut generation at the next question (or an end-of-text marker)."""
    return stopping.truncate_at_stop(text, stop_sequences)


def normalize_number(text: str) -> str | None:
    """``"$1,234.50"`` -> ``"1234.5"``; ``"-3.00"`` -> ``"-3"``; None if it is not a number."""
    negative = "-" in text
    digits = re.sub(r"[^\d.]", "", text)
    try:
        value = Decimal(digits)
    except InvalidOperation:
        return None
    value = -value if negative else value
    normalised = format(value.normalize(), "f")
    return "0" if normalised in ("-0", "0") else normalised


def extract_answer(text: str) -> str | None:
    """The model's final answer as a normalised number string, or None if it gave no number."""
    marked = list(_MARKED.finditer(text))
    if marked:
        return normalize_number(marked[-1].group(1))
    numbers = _ANY_NUMBER.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


def answers_match(prediction: str | None, gold: str) -> bool:
    """Numeric equality of two normalised answers (so ``18`` == ``18.00``)."""
    if prediction is None:
        return False
    try:
        return Decimal(prediction) == Decimal(gold)
    except InvalidOperation:
        return False


def read_completions(path: str | Path, n_problems: int) -> list[dict]:
    """Read ``idx``/``completion`` JSONL; ``idx`` indexes the evaluated split, one completion per problem
    (accuracy and Table 1's n count problems)."""
    seen: set[int] = set()

    def check_idx(idx) -> None:
        if not isinstance(idx, int) or isinstance(idx, bool) or not 0 <= idx < n_problems:
            raise ValueError(f"idx must be an integer in [0, {n_problems}), got {idx!r}")
        if idx in seen:
            raise ValueError(f"idx {idx} has a completion on an earlier line already: GSM8K scores one completion "
                             "per problem")
        seen.add(idx)

    return jsonl.read_completions(path, "idx", check_idx)


def score(records: Sequence[dict], problems: Sequence[dict]) -> list[dict]:
    """Score ``{idx, completion}`` records in input order: ``idx``, ``prediction``, ``gold``, ``correct``."""
    results = []
    for record in records:
        gold = gold_answer(problems[record["idx"]]["answer"])
        prediction = extract_answer(truncate_at_stop(record["completion"]))
        results.append({
            "idx": record["idx"],
            "prediction": prediction,
            "gold": gold,
            "correct": answers_match(prediction, gold),
        })
    return results


# ---- the benchmark script's specification (eval/gsm8k.py) ------------------------------------------
def _benchmark_base():
    from rpt.evaluation.benchmark_script import (
        Benchmark,  # late: the skeleton pulls in torch, only scripts need it
    )

    return Benchmark


class GSM8K(_benchmark_base()):
    """GSM8K for :func:`rpt.evaluation.benchmark_script.run`: k-shot chain of thought, exact numeric answer."""

    name = "gsm8k"
    title = "GSM8K"
    script = "eval/gsm8k.py"
    default_out = "runs/eval/gsm8k.json"
    id_field = "idx"
    metric = "accuracy"
    given = "gold"
    chat_prompt = ("The shots become earlier turns (user 'Question: ...\\nAnswer:', assistant the worked answer), "
                   "as lm-eval's --fewshot_as_multiturn")

    def __init__(self, description: str = "") -> None:
        self.description = description

    def add_args(self, parser) -> None:
        parser.add_argument("--data", default=None,
                            help="JSONL of {question, answer}; default: the local copy's <split>.jsonl ($RPT_GSM8K_DIR, "
                                 "else ../shared/data/gsm8k), else the hub (openai/gsm8k); 'hub' asks for the hub")
        parser.add_argument("--split", default="test", help="split of the local copy or the hub when --data is not a file")
        parser.add_argument("--shots", type=int, default=DEFAULT_SHOTS, help="few-shot examples in the prompt")
        parser.add_argument("--train-data", default=None,
                            help="JSONL the shots come from (default: train.jsonl beside the --data file, else the local "
                                 "copy's, else the hub's train split)")

    def check_args(self, parser, args) -> None:
        if args.shots < 0:
            parser.error("--shots must be >= 0")

    def load(self, args) -> list[dict]:
        return load_gsm8k(data_source(args.data, args.split), args.split)

    def given_records(self, args, problems: list[dict]) -> list[dict]:
        if args.completions == "gold":
            records = [{"idx": i, "completion": gold_completion(p["answer"])} for i, p in enumerate(problems)]
        else:
            records = read_completions(args.completions, len(problems))
        return records

    def task_ids(self, problems: list[dict]) -> list[int]:
        return list(range(len(problems)))

    def shots(self, args) -> list[dict]:
        """The first ``--shots`` problems of the train split (``fewshot_prefix``'s, always the same ones)."""
        if args.shots == 0:
            return []
        train_data, data = args.train_data, data_source(args.data, args.split)
        if train_data is None and data is not None:
            beside = Path(data).with_name("train.jsonl")
            if beside.is_file() and beside.resolve() != Path(data).resolve():
                train_data = str(beside)
        if train_data is None and args.data != "hub":
            train_data = data_source(None, "train")
        train = load_gsm8k(train_data, "train")
        fewshot_prefix(train, args.shots)  # too few train problems: its one clear error
        return train[: args.shots]

    def prefix(self, args) -> str:
        """The fixed ``--shots``-shot prefix from the train split."""
        return fewshot_prefix(self.shots(args), args.shots)

    def items(self, args, problems: list[dict]) -> list[dict]:
        """``{"id", "prompt"}``; under ``--chat`` ``{"id", "messages"}``: the shots as earlier turns."""
        if getattr(args, "chat", False):
            turns = [(format_example(p["question"]), chain_of_thought(p["answer"])) for p in self.shots(args)]
            return [{"id": i, "messages": chat_prompts.gsm8k_turns(turns, format_example(p["question"]))}
                    for i, p in enumerate(problems[: args.limit])]
        prefix = self.prefix(args)
        return [{"id": i, "prompt": build_prompt(prefix, p["question"])} for i, p in enumerate(problems[: args.limit])]

    def stop(self, args) -> list[str]:
        return list(STOP_SEQUENCES)

    def too_long_fix(self, args) -> str:
        return f"use fewer --shots (now {args.shots}; each adds a worked example) or a model with a longer context"

    def record(self, item_id, completion: str) -> dict:
        return {"idx": item_id, "completion": truncate_at_stop(completion)}

    def score(self, args, problems: list[dict], records: list[dict], store) -> list[dict]:
        results = score(records, problems)
        if args.checkpoint is not None:  # generated answers are kept beside their scores
            results = [{**r, "completion": rec["completion"]} for r, rec in zip(results, records)]
        return results

    def metrics(self, args, results: list[dict]) -> dict:
        n = len(results)
        return {"n": n, "accuracy": sum(r["correct"] for r in results) / n if n else 0.0}

    def header(self, args) -> dict:
        data = data_source(args.data, args.split) or f"hub:{'/'.join(HUB_DATASET)}:{args.split}"
        return {"data": data} if args.completions is not None else {"data": data, "shots": args.shots}

    def failures(self, results: list[dict]) -> tuple[list[str], list[list]]:
        wrong = [[r["idx"], r["prediction"], r["gold"]] for r in results if not r["correct"]]
        return ["wrong idx (first 50)", "prediction", "gold"], wrong[:50]
