"""GSM8K: gold scoring on the full test split, answer formats, stop sequences, prompts, bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rpt.evaluation import gsm8k
from tests.helpers.scripts import ROOT, load_script

DATA = Path(os.environ.get("RPT_GSM8K_DIR", ROOT.parent / "shared" / "data" / "gsm8k"))
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"GSM8K data not found at {DATA}; set RPT_GSM8K_DIR")


@pytest.fixture(scope="module")
def script():
    return load_script("eval/gsm8k.py")


@pytest.fixture(scope="module")
def train() -> list[dict]:
    return gsm8k.load_gsm8k(DATA / "train.jsonl")


@needs_data
def test_gold_completions_score_1_on_all_1319_test_problems(script, tmp_path, capsys):
    out = tmp_path / "gsm8k.json"
    assert script.main(["--completions", "gold", "--data", str(DATA / "test.jsonl"), "--out", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["n"] == 1319
    wrong = [r for r in summary["results"] if not r["correct"]]
    assert wrong == [] and summary["accuracy"] == 1.0
    assert [r["idx"] for r in summary["results"]] == list(range(1319))
    assert set(summary["results"][0]) == {"idx", "prediction", "gold", "correct"}
    assert out.with_suffix(".md").exists() and out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert str(out) in capsys.readouterr().out


def test_completion_file_scoring_in_input_order(script, tmp_path):
    problems = [{"question": "q0", "answer": "x\n#### 18"}, {"question": "q1", "answer": "y\n#### 1,000"}]
    data = tmp_path / "test.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in problems))
    rows = [{"idx": 1, "completion": " 10 * 100 = 1000. The answer is $1,000."},
            {"idx": 0, "completion": " 2 * 9 = 18. The answer is 20."}]
    completions = tmp_path / "c.jsonl"
    completions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "o.json"
    assert script.main(["--completions", str(completions), "--data", str(data), "--out", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert [(r["idx"], r["prediction"], r["gold"], r["correct"]) for r in summary["results"]] == [
        (1, "1000", "1000", True), (0, "20", "18", False)]
    assert summary["n"] == 2 and summary["accuracy"] == pytest.approx(1 / 2)


@pytest.mark.parametrize("text, expected", [
    ("She has 3 + 4 = 7 apples.\nThe answer is 7.", "7"),
    ("#### 72", "72"),
    ("so #### 1,234", "1234"),
    ("The answer is $1,234.00.", "1234"),
    ("The answer is 5.0", "5"),
    ("The answer is 12.50 dollars.", "12.5"),
    ("The answer is -3.", "-3"),
    ("The answer is $-3", "-3"),
    ("The answer is 40%.", "40"),
    ("The answer is 18 dollars.", "18"),
    ("the final answer is: **42**", "42"),
    ("The answer is 1,450,000.", "1450000"),
    ("The answer is 0.5 hours", "0.5"),
    ("No marker: 3 boxes of 12 is 36 pencils.", "36"),
    ("Lists are not thousands: 3,4,5", "5"),
    ("He pays $2,000 in total", "2000"),
    ("Nothing numeric here.", None),
])
def test_answer_extraction_formats(text, expected):
    assert gsm8k.extract_answer(text) == expected


def test_marker_beats_later_numbers_and_last_marker_wins():
    assert gsm8k.extract_answer("The answer is 12. I used 3 steps.") == "12"
    assert gsm8k.extract_answer("If the answer is 5 we are wrong. The answer is 7.") == "7"


@pytest.mark.parametrize("wrong", [
    "The answer is 180.",
    "The answer is 1800",
    "The answer is 18.5.",
    "The answer is 81.",
    "The answer is -18.",
    "16 - 3 - 4 = 9 eggs, 9 * 2 = 18 dollars. The answer is 20.",
    "18 is what I thought first, but the answer is 17.",
    "It costs 18 dollars per box and she buys 2 boxes, so 36",
])
def test_wrong_answers_containing_the_right_number_are_wrong(wrong):
    [result] = gsm8k.score([{"idx": 0, "completion": wrong}], [{"question": "q", "answer": "#### 18"}])
    assert result["correct"] is False


@pytest.mark.parametrize("right", ["The answer is 18.", "The answer is 18.00", "The answer is $18", "#### 18"])
def test_equivalent_forms_of_the_right_answer_are_right(right):
    [result] = gsm8k.score([{"idx": 0, "completion": right}], [{"question": "q", "answer": "#### 18"}])
    assert result["correct"] is True


def test_generation_stops_at_the_next_question():
    completion = " 2 + 3 = 5. The answer is 5.\n\nQuestion: Tom has 7 cats.\nAnswer: The answer is 7."
    assert gsm8k.truncate_at_stop(completion) == " 2 + 3 = 5. The answer is 5.\n\n"
    [result] = gsm8k.score([{"idx": 0, "completion": completion}], [{"question": "q", "answer": "#### 5"}])
    assert result["prediction"] == "5" and result["correct"]
    tail = " I think it is 4.\nQuestion: what is 9? The answer is 9."
    [result] = gsm8k.score([{"idx": 0, "completion": tail}], [{"question": "q", "answer": "#### 9"}])
    assert result["prediction"] == "4" and not result["correct"]


@needs_data
def test_fixed_eight_shot_prompt_from_the_train_split(train):
    prefix = gsm8k.fewshot_prefix(train)
    prompt = gsm8k.build_prompt(prefix, "How many legs do 3 cats have?")
    assert prompt.count("Question:") == 9 and prompt.count("The answer is") == 8
    assert prompt.startswith(f"Question: {train[0]['question']}\nAnswer: ")
    assert f"Question: {train[7]['question']}" in prompt and train[8]["question"] not in prompt
    assert "The answer is 72.\n\nQuestion:" in prompt  # train[0] ends in #### 72
    assert "<<" not in prompt and "####" not in prompt
    assert prompt.endswith("\n\nQuestion: How many legs do 3 cats have?\nAnswer:")
    assert gsm8k.fewshot_prefix(train) == prefix  # fixed, not sampled
    assert gsm8k.fewshot_prefix(train, 2).count("Question:") == 2


def test_chain_of_thought_and_gold_answer():
    answer = "He buys 2 * $3 = $<<2*3=6>>6 of bread.\nThen 6 + 1,000 = <<6+1000=1006>>1,006.\n#### 1,006"
    assert gsm8k.chain_of_thought(answer) == "He buys 2 * $3 = $6 of bread.\nThen 6 + 1,000 = 1,006.\nThe answer is 1,006."
    assert gsm8k.gold_answer(answer) == "1006"


@pytest.mark.parametrize("data_rows, completion_rows, message", [
    (None, [], "file not found"),
    (['{"question": "q", "answer": "#### 1"}', "not json"], None, "test.jsonl:2: malformed JSON"),
    (['{"question": "q", "answer": "no final"}'], None, "test.jsonl:1: answer has no '#### N'"),
    (['{"question": "q", "answer": "#### 1"}'], ['{"idx": 3, "completion": "1"}'], "c.jsonl:1: idx must be"),
    (['{"question": "q", "answer": "#### 1"}'], ['{"idx": 0, "completion": "1"}', '{"idx": 0}'],
     "c.jsonl:2: missing field(s) completion"),
])
def test_bad_input_gives_one_clear_error(script, tmp_path, capsys, data_rows, completion_rows, message):
    data, completions = tmp_path / "test.jsonl", tmp_path / "c.jsonl"
    if data_rows is not None:
        data.write_text("\n".join(data_rows) + "\n")
    if completion_rows is not None:
        completions.write_text("\n".join(completion_rows) + "\n")
    source = str(completions) if completion_rows is not None else "gold"
    assert script.main(["--completions", source, "--data", str(data), "--out", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def test_a_few_shot_prompt_longer_than_the_context_names_shots(script, tmp_path, capsys):
    """8 shots overflow a 256-position model: one line that names --shots, before any generation."""
    from tests.helpers.eval_helpers import gsm8k_folder
    from tests.helpers.tiny_models import save_tiny_checkpoint

    data = gsm8k_folder(tmp_path / "gsm8k", n_train=8, n_test=2)
    ckpt = save_tiny_checkpoint(tmp_path / "ckpt")
    out = tmp_path / "o.json"
    argv = ["--checkpoint", ckpt, "--data", str(data / "test.jsonl"), "--shots", "8", "--out", str(out)]
    capsys.readouterr()  # the checkpoint's saving bars
    assert script.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: prompt 0 has") and "context is 256" in err and "--shots (now 8" in err
    assert len(err.splitlines()) == 1
    assert not out.exists() and not out.with_suffix(".md").exists()
    assert script.main([*argv[:-4], "--shots", "1", "--max-new-tokens", "2", "--out", str(out)]) == 0  # fewer fit
