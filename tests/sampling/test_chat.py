"""``--chat``: prompts through the tokenizer's chat template in ``sample.py`` and the evaluation
scripts. The token ids equal ``apply_chat_template(..., tokenize=True)`` (with and without a
BOS-adding tokenizer); the code prompt equals EvalPlus's own ``make_raw_chat_prompt``; a tokenizer
without a template is one ``error:`` line before anything is loaded or written."""

from __future__ import annotations

import argparse
import inspect
import json

import pytest

from rpt.evaluation import chat_prompts, gsm8k
from rpt.sampling.text import chat
from tests.helpers.chat_helpers import add_chat_template, chat_tokenizer
from tests.helpers.eval_helpers import gsm8k_folder, long_context_checkpoint
from tests.helpers.scripts import load_script

MESSAGES = [[{"role": "user", "content": "def add(a, b):"}],
            [{"role": "user", "content": "Question: 2 + 2?\nAnswer:"}, {"role": "assistant", "content": "4"},
             {"role": "user", "content": "Question: 3 + 3?\nAnswer:"}]]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat")
    return {"chat": add_chat_template(long_context_checkpoint(root / "chat")),
            "base": long_context_checkpoint(root / "base")}


def one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    errors = [line for line in err if line.startswith("error:")]
    assert len(errors) == 1 and not any("Traceback" in line for line in err), err
    return errors[0]


@pytest.mark.parametrize("bos", [False, True], ids=["no-bos", "bos-adding"])
@pytest.mark.parametrize("messages", MESSAGES, ids=["one-turn", "multi-turn"])
def test_rendered_prompt_tokenizes_to_apply_chat_template(bos, messages):
    tokenizer = chat_tokenizer(bos)
    want = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)["input_ids"]
    assert tokenizer(chat.render(tokenizer, messages))["input_ids"] == want
    if bos:  # one BOS, not the template's plus the tokenizer's
        assert want[:2] == [tokenizer.bos_token_id, tokenizer("<|user|>", add_special_tokens=False)["input_ids"][0]]


def test_code_prompt_is_evalplus_make_raw_chat_prompt():
    from evalplus import codegen
    from evalplus.provider.utility import make_raw_chat_prompt

    source = inspect.getsource(codegen.run_codegen)  # the instruction and reply start evalplus uses by default
    assert f'instruction_prefix = "{chat_prompts.INSTRUCTION}"' in source
    assert f'response_prefix = "{chat_prompts.RESPONSE}"' in source
    tokenizer = chat_tokenizer()
    task = 'def add(a, b):\n    """Add a and b."""\n'
    ours = chat.render(tokenizer, *chat_prompts.code_turns(task))
    assert ours == make_raw_chat_prompt(task, chat_prompts.INSTRUCTION, chat_prompts.RESPONSE, tokenizer)
    assert ours.endswith("```python\n") and "\n```\n" in chat_prompts.CODE_STOP


def test_gsm8k_chat_turns_are_the_shots_then_the_question(tmp_path):
    data = gsm8k_folder(tmp_path, n_train=3, n_test=2)
    args = argparse.Namespace(chat=True, shots=2, train_data=None, data=str(data / "test.jsonl"), split="test",
                              limit=None)
    bench = gsm8k.GSM8K()
    items = bench.items(args, gsm8k.load_gsm8k(data / "test.jsonl"))
    train = gsm8k.load_gsm8k(data / "train.jsonl")
    turns = items[1]["messages"]
    assert [t["role"] for t in turns] == ["user", "assistant", "user", "assistant", "user"]
    assert turns[0]["content"] == gsm8k.format_example(train[0]["question"])
    assert turns[1]["content"] == gsm8k.chain_of_thought(train[0]["answer"])
    assert turns[4]["content"] == gsm8k.format_example(gsm8k.load_gsm8k(data / "test.jsonl")[1]["question"])


def test_sample_chat_is_the_rendered_prompt(ckpts, capsys):
    script = load_script("sample.py")
    common = ["--checkpoint", ckpts["chat"], "--max-new-tokens", "6", "--temperature", "0"]
    assert script.main([*common, "--prompt", "def add(a, b):", "--chat"]) == 0
    with_chat = capsys.readouterr().out
    from transformers import AutoTokenizer

    rendered = chat.user_prompt(AutoTokenizer.from_pretrained(ckpts["chat"]), "def add(a, b):")
    assert rendered.startswith("<|user|>\ndef add(a, b):") and rendered.endswith("<|assistant|>\n")
    assert script.main([*common, "--prompt", rendered]) == 0
    assert capsys.readouterr().out == with_chat


def test_chat_without_a_template_is_one_line(ckpts, tmp_path, capsys):
    out = tmp_path / "o.jsonl"
    assert load_script("sample.py").main(["--checkpoint", ckpts["base"], "--prompt", "x", "--chat",
                                          "--output", str(out)]) == 2
    assert "--chat needs a chat template" in one_error_line(capsys) and not out.exists()
    out = tmp_path / "he.json"
    assert load_script("eval/humaneval.py").main(["--checkpoint", ckpts["base"], "--chat", "--limit", "1",
                                                  "--out", str(out)]) == 2
    assert "--chat needs a chat template" in one_error_line(capsys)
    assert not list(tmp_path.glob("he*"))  # nothing written, not even the resume store
    assert load_script("eval/humaneval.py").main(["--completions", "canonical", "--chat", "--out", str(out)]) == 2
    assert "--chat builds the prompts of generation" in one_error_line(capsys)


@pytest.mark.parametrize("plus", [False, True], ids=["humaneval", "humaneval+"])
def test_code_benchmark_under_chat_scores_the_replys_program(ckpts, tmp_path, plus, monkeypatch):
    from rpt.evaluation import evalplus_scoring as plus_data

    if plus and not (plus_data.data_dir() / plus_data.FILES["humaneval"]).is_file():
        pytest.skip("EvalPlus data not found; set RPT_EVALPLUS_DIR")
    monkeypatch.setenv("RPT_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "he.json"
    argv = [*(["--plus"] if plus else []), "--checkpoint", ckpts["chat"], "--chat", "--limit", "2",
            "--max-new-tokens", "8", "--out", str(out), "--workers", "2"]
    assert load_script("eval/humaneval.py").main(argv) == 0
    summary = json.loads(out.read_text())
    assert summary["chat"] is True and summary["n_problems"] == 2
    for result in summary["results"]:
        assert result["solution"] == chat_prompts.solution_from_reply(result["completion"], "has_close_elements"
                                                                      if result["task_id"] == "HumanEval/0" else
                                                                      "separate_paren_groups")
    rows = [json.loads(line) for line in (tmp_path / "he.rpt0_t0.samples.jsonl").read_text().splitlines()]
    assert [(r["task_id"], r["solution"]) for r in rows] == [(r["task_id"], r["solution"]) for r in summary["results"]]


def test_a_chat_reply_becomes_a_sanitized_program():
    from rpt.evaluation.code_benchmarks import HumanEval

    bench = HumanEval()
    args = argparse.Namespace(chat=True, limit=None)
    bench.items(args, {"HumanEval/0": {"prompt": "def f(x):\n", "entry_point": "f"}})
    reply = "import math\n\ndef g(y):\n    return y\n\ndef f(x):\n    return g(math.floor(x))\n\nprint(f(1.5))\n```\nNote"
    record = bench.record("HumanEval/0", reply)
    assert record["completion"] == reply[: reply.index("\nprint(")]  # EvalPlus's earliest end marker
    assert record["solution"] == "import math\ndef g(y):\n    return y\ndef f(x):\n    return g(math.floor(x))"


def test_gsm8k_runs_under_chat(ckpts, tmp_path):
    data = gsm8k_folder(tmp_path / "gsm8k", n_train=2, n_test=2)
    out = tmp_path / "g.json"
    argv = ["--checkpoint", ckpts["chat"], "--chat", "--data", str(data / "test.jsonl"), "--shots", "2",
            "--max-new-tokens", "4", "--out", str(out)]
    assert load_script("eval/gsm8k.py").main(argv) == 0
    summary = json.loads(out.read_text())
    assert summary["chat"] is True and summary["n"] == 2


def test_table1_chat_without_a_template_is_one_line_before_any_run(ckpts, tmp_path, capsys):
    out = tmp_path / "t1"
    assert load_script("eval/table1.py").main(["--checkpoint", ckpts["base"], "--chat", "--out", str(out)]) == 2
    assert "--chat needs a chat template" in one_error_line(capsys) and not out.exists()


def test_sample_chat_batch_equals_each_prompt_alone(ckpts, tmp_path, capsys):
    """Chat prompts of different lengths in one batch give each prompt's text alone (left padding)."""
    prompts = tmp_path / "p.jsonl"
    texts = ["def add(a, b):", "x", "class Point:\n    def __init__(self):"]
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    common = ["--checkpoint", ckpts["chat"], "--chat", "--max-new-tokens", "6", "--temperature", "0"]
    assert load_script("sample.py").main([*common, "--prompts", str(prompts), "--batch-size", "3"]) == 0
    batched = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["prompt"] for r in batched] == texts  # the output keeps the prompt as given
    for text, row in zip(texts, batched):
        assert load_script("sample.py").main([*common, "--prompt", text]) == 0
        assert capsys.readouterr().out == row["completion"] + "\n"  # the streamed text, then a newline


# ---- a template that fails: one line naming the tokenizer, the template and jinja's message ----------
BAD_TEMPLATES = {  # kind -> (chat_template, what the line says)
    "raises": ("{% for m in messages %}{{ m['content'] }}\n{{ raise_exception('roles must alternate') }}{% endfor %}",
               "at template line 2: TemplateError: roles must alternate"),
    "syntax error": ("{% for m in messages %}\n{{ m['content'] }", "at template line 2: TemplateSyntaxError"),
    # jinja's sandbox renders a blocked attribute as "" and goes on: the prompt would have a hole
    "sandbox-blocked attribute": ("{{ messages.__class__ }}{% for m in messages %}{{ m['content'] }}{% endfor %}",
                                  "SecurityError: access to attribute '__class__' of 'list' object is unsafe"),
    "sandbox-blocked call": ("{% set x = messages.append(1) %}{{ messages }}", "SecurityError: access to attribute "
                                                                                "'append'"),
    "include": ("{% include 'other.jinja' %}", "TypeError: no loader for this environment specified; jinja's sandbox "
                                               "has no loader"),
    "not a string": (5, "is an int, not a string of jinja source"),
    "a list": ([{"name": "default"}], "is a list, not a string"),
    "named set without a default": ({"tool_use": "{{ 'x' }}"}, "named templates ['tool_use'] without a 'default'"),
    "range past the sandbox's limit": ("{% for i in range(10**9) %}{% endfor %}", "OverflowError: Range too big"),
}


@pytest.mark.parametrize("kind", list(BAD_TEMPLATES))
def test_a_failing_template_is_one_chat_template_error(kind):
    template, says = BAD_TEMPLATES[kind]
    tokenizer = chat_tokenizer()
    tokenizer.chat_template = template
    with pytest.raises(chat.ChatTemplateError) as error:
        chat.render(tokenizer, MESSAGES[0])
    line = str(error.value)
    assert "\n" not in line and says in line and line.startswith("the chat template of tokenizer"), line


def test_a_sandbox_blocked_access_is_refused_where_transformers_would_leave_a_hole():
    """The control: transformers alone renders the blocked access as nothing and goes on."""
    template = "[{{ messages.__class__ }}]{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tokenizer = chat_tokenizer()
    tokenizer.chat_template = template + " "  # its own compiled copy, not the one render() made strict
    assert tokenizer.apply_chat_template(MESSAGES[0], tokenize=False) == "[]def add(a, b): "
    tokenizer.chat_template = template
    with pytest.raises(chat.ChatTemplateError, match="SecurityError"):
        chat.render(tokenizer, MESSAGES[0])


@pytest.fixture(scope="module")
def bad_ckpts(ckpts, tmp_path_factory):
    """Copies of the chat checkpoint whose template files are broken: on disk, as a hostile checkpoint has them."""
    import shutil

    root = tmp_path_factory.mktemp("bad_chat")
    made = {}
    for name, edit in {
        "blocked": lambda d: (d / "chat_template.jinja").write_text("{{ messages.__class__ }}{% for m in messages %}"
                                                                    "{{ m['content'] }}{% endfor %}"),
        "not utf-8": lambda d: (d / "chat_template.jinja").write_bytes(b"\xff\xfe{{ messages }}"),
        "malformed list": lambda d: ((d / "chat_template.jinja").unlink(), _set_config(d, [{"name": "default"}])),
    }.items():
        folder = root / name.replace(" ", "_")
        shutil.copytree(ckpts["chat"], folder)
        edit(folder)
        made[name] = str(folder)
    return made


def _set_config(folder, template):
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("kind, says", [("not utf-8", "chat_template.jinja is not UTF-8 text (byte 1)"),
                                        ("malformed list", "tokenizer_config.json: chat_template must be a string")])
def test_template_files_transformers_cannot_read_are_named(bad_ckpts, kind, says):
    from rpt.sampling.loading import load_tokenizer

    with pytest.raises(ValueError, match="cannot load a tokenizer from") as error:
        load_tokenizer(bad_ckpts[kind])
    assert says in str(error.value) and bad_ckpts[kind] in str(error.value)


def test_every_chat_entry_point_stops_on_a_failing_template_with_nothing_written(bad_ckpts, tmp_path, capsys):
    """sample.py, the code benchmarks, GSM8K and Table 1: one line naming the template file and jinja's
    message, exit 2, before a model loads, with no output, resume store or Table 1 folder."""
    bad = bad_ckpts["blocked"]
    data = gsm8k_folder(tmp_path / "gsm8k", n_train=2, n_test=2) / "test.jsonl"
    runs = {
        "sample.py": ["--checkpoint", bad, "--prompt", "x", "--chat", "--output", str(tmp_path / "s.jsonl")],
        "eval/humaneval.py": ["--checkpoint", bad, "--chat", "--limit", "1", "--out", str(tmp_path / "he.json")],
        "eval/gsm8k.py": ["--checkpoint", bad, "--chat", "--data", str(data), "--shots", "1",
                          "--out", str(tmp_path / "g.json")],
        "eval/table1.py": ["--checkpoint", bad, "--chat", "--out", str(tmp_path / "t1")],
    }
    for script, argv in runs.items():
        assert load_script(script).main(argv) == 2, script
        line = one_error_line(capsys)
        assert f"{bad}/chat_template.jinja" in line and "SecurityError" in line, (script, line)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gsm8k"]  # nothing else written
    assert load_script("sample.py").main(["--checkpoint", bad_ckpts["malformed list"], "--prompt", "x", "--chat"]) == 2
    assert "chat_template must be a string" in one_error_line(capsys)


def test_table1_checks_each_benchmarks_chat_turns_before_the_first_run(ckpts, tmp_path, capsys):
    """A template that refuses an assistant turn fails GSM8K's multi-turn prompt: found before HumanEval+ runs."""
    import shutil

    folder = tmp_path / "no_assistant"
    shutil.copytree(ckpts["chat"], folder)
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ raise_exception('no assistant turns') }}"
        "{% endif %}{{ m['content'] }}{% endfor %}")
    out = tmp_path / "t1"
    assert load_script("eval/table1.py").main(["--checkpoint", str(folder), "--chat", "--out", str(out)]) == 2
    assert "no assistant turns" in one_error_line(capsys) and not out.exists()


def test_lm_eval_apply_chat_template_uses_the_same_rendering(ckpts, bad_ckpts):
    pytest.importorskip("lm_eval")
    from rpt.evaluation.lm_eval_adapter import RPTLM

    lm = RPTLM(pretrained=ckpts["chat"])
    assert lm.chat_template(True) == lm.tokenizer.chat_template and lm.chat_template(False) is None
    assert lm.apply_chat_template(MESSAGES[1]) == chat.render(lm.tokenizer, MESSAGES[1])
    with pytest.raises(chat.ChatTemplateError, match="SecurityError"):
        RPTLM(pretrained=bad_ckpts["blocked"]).chat_template(True)
