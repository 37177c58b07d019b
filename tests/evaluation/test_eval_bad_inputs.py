"""The code and GSM8K scripts on bad input: one ``error:`` line naming the file, the line and
the field, exit status 2, before any program runs and with nothing written; ``--limit`` means
"the first N task ids of the completions" in every benchmark; and a hostile completion fails
its own item only, the run writing its report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rpt.evaluation import evalplus_scoring as plus
from rpt.sandbox.child import Child
from tests.helpers.scripts import load_script

PLUS_MISSING = pytest.mark.skipif(not (plus.data_dir() / plus.FILES["humaneval"]).is_file(),
                                  reason="EvalPlus data not found; set RPT_EVALPLUS_DIR")
SCRIPTS = [pytest.param("eval/humaneval.py", [], "HumanEval/0", id="humaneval"),
           pytest.param("eval/humaneval.py", ["--plus"], "HumanEval/0", id="humaneval+", marks=PLUS_MISSING),
           pytest.param("eval/mbpp.py", [], "Mbpp/2", id="mbpp+", marks=PLUS_MISSING)]


@pytest.fixture()
def no_programs(monkeypatch):
    """Fails the test if any program would be started."""

    def refuse(*args, **kwargs):
        raise AssertionError("a program ran before the input was checked")

    monkeypatch.setattr(Child, "__init__", refuse)


def write_lines(path: Path, lines: list) -> Path:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n" for x in lines))
    return path


def one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    errors = [line for line in err if line.startswith("error:")]
    assert len(errors) == 1, err
    return errors[0]


BAD_RECORDS = {
    "task_id a list": ({"task_id": ["HumanEval/0"], "completion": "    return 1\n"}, "task_id"),
    "task_id a dict": ({"task_id": {"id": 0}, "completion": "    return 1\n"}, "task_id"),
    "task_id null": ({"task_id": None, "completion": "    return 1\n"}, "task_id"),
    "task_id true": ({"task_id": True, "completion": "    return 1\n"}, "task_id"),
    "completion a list": ({"task_id": "TASK", "completion": ["return 1"]}, "completion"),
    "not UTF-8": (b'{"task_id": "TASK", "completion": "\xff\xfe"}', "UTF-8"),
}


# every kind on HumanEval; on the EvalPlus scripts (each load reads its whole data file) the ids
# that are not hashable (a list, a mapping) and a non-UTF-8 line
CASES = [(*s.values, kind) if not s.marks else pytest.param(*s.values, kind, marks=s.marks, id=f"{s.id}-{kind}")
         for s in SCRIPTS for kind in sorted(BAD_RECORDS)
         if s.id == "humaneval" or kind in ("task_id a list", "task_id a dict", "not UTF-8")]


@pytest.mark.parametrize("script, extra, task, kind", CASES)
def test_a_malformed_record_is_one_line_naming_file_line_and_field(script, extra, task, kind, tmp_path, capsys,
                                                                    no_programs):
    record, field = BAD_RECORDS[kind]
    record = record.replace(b"TASK", task.encode()) if isinstance(record, bytes) else \
        {k: (task if v == "TASK" else v) for k, v in record.items()}
    path = write_lines(tmp_path / "c.jsonl", [{"task_id": task, "completion": "    return 1\n"}, record])
    out = tmp_path / "out.json"
    assert load_script(script).main([*extra, "--completions", str(path), "--out", str(out)]) == 2
    line = one_error_line(capsys)
    assert f"{path}:2" in line and field in line, line
    assert not out.exists()


@pytest.mark.parametrize("script, extra, task", SCRIPTS)
def test_out_naming_a_folder_stops_before_the_run(script, extra, task, tmp_path, capsys, no_programs):
    folder = tmp_path / "existing"
    folder.mkdir()
    assert load_script(script).main([*extra, "--completions", "canonical", "--out", str(folder)]) == 2
    assert "is a directory" in one_error_line(capsys)
    file = tmp_path / "file"
    file.write_text("")
    assert load_script(script).main([*extra, "--completions", "canonical", "--out", str(file / "x.json")]) == 2
    assert "is a file" in one_error_line(capsys)


@pytest.mark.parametrize("script, extra", [("eval/humaneval.py", []),
                                           pytest.param("eval/humaneval.py", ["--plus"], marks=PLUS_MISSING)])
def test_limit_means_the_benchmarks_first_tasks_whatever_the_file_holds(script, extra, tmp_path, capsys):
    """A file that leaves out a task inside --limit is an error (with and without --plus), not a note."""
    """Before: --limit 1 scored the file's first task id (HumanEval/5), not the benchmark's first."""
    from rpt.evaluation import humaneval as he

    problems = he.load_problems()
    rows = [{"task_id": t, "completion": problems[t]["canonical_solution"]}
            for t in ("HumanEval/5", "HumanEval/3", "HumanEval/0", "HumanEval/5")]
    path = write_lines(tmp_path / "c.jsonl", rows)
    out = tmp_path / "out.json"
    common = [*extra, "--completions", str(path), "--out", str(out), "--workers", "1", "--limit"]
    assert load_script(script).main([*common, "1"]) == 0
    summary = json.loads(out.read_text())
    assert [r["task_id"] for r in summary["results"]] == ["HumanEval/0"] and summary["results"][0]["passed"]
    assert summary["ignored_completions"] == 3 and summary["tasks_without_completion"] == 0
    assert "3 completions of" in capsys.readouterr().err  # said, not silently dropped
    out.unlink()
    assert load_script(script).main([*common, "2"]) == 2  # HumanEval/1 has none: an error, nothing scored
    line = one_error_line(capsys)
    assert "no completion for 1 of the first 2 tasks (first: HumanEval/1)" in line and not out.exists()
    if extra:
        return  # the rest is the skeleton's, shared by every benchmark (an EvalPlus run costs seconds)
    assert load_script(script).main([*common, "5"]) == 2  # the class: 1, 2 and 4 missing of the first 5
    assert "3 of the first 5 tasks (first: HumanEval/1, HumanEval/2, HumanEval/4)" in one_error_line(capsys)
    write_lines(path, rows[:2])  # nothing for the first task: refused, nothing written
    assert load_script(script).main([*common, "1"]) == 2
    assert "no completion for the first 1 tasks" in one_error_line(capsys) and not out.exists()


def test_gsm8k_limit_is_the_first_problems_and_one_completion_each(tmp_path, capsys):
    from tests.helpers.eval_helpers import gsm8k_folder

    data = gsm8k_folder(tmp_path / "g", n_train=1, n_test=3) / "test.jsonl"
    completions = write_lines(tmp_path / "c.jsonl", [{"idx": 2, "completion": "The answer is 0."},
                                                     {"idx": 0, "completion": "The answer is 307."}])
    out = tmp_path / "out.json"
    argv = ["--data", str(data), "--completions", str(completions), "--out", str(out), "--limit", "1"]
    assert load_script("eval/gsm8k.py").main(argv) == 0
    summary = json.loads(out.read_text())
    assert [r["idx"] for r in summary["results"]] == [0] and summary["accuracy"] == 1.0
    assert summary["ignored_completions"] == 1
    write_lines(completions, [{"idx": 0, "completion": "1"}, {"idx": 0, "completion": "307"}])
    assert load_script("eval/gsm8k.py").main(argv) == 2  # two answers to one problem would count it twice
    assert f"{completions}:2: idx 0 has a completion on an earlier line" in one_error_line(capsys)


def test_a_pass_at_k_without_k_samples_is_refused_before_any_program(tmp_path, capsys, no_programs):
    """Before: --k 1 2 with one sample per task reported pass@1 alone, pass@2 dropped without a word."""
    path = write_lines(tmp_path / "c.jsonl", [{"task_id": "HumanEval/0", "completion": "    return 1\n"}] * 2
                       + [{"task_id": "HumanEval/1", "completion": "    return 1\n"}])
    out = tmp_path / "out.json"
    assert load_script("eval/humaneval.py").main(["--completions", str(path), "--k", "1", "2", "--out", str(out)]) == 2
    assert "--k 2 needs at least 2 completions of every task" in one_error_line(capsys) and not out.exists()
    with pytest.raises(SystemExit) as stop:  # generation: refused with the flags, before the model loads
        load_script("eval/humaneval.py").main(["--checkpoint", str(tmp_path), "--k", "1", "5", "--out", str(out)])
    assert stop.value.code == 2 and "--k 5 needs --n-samples >= 5" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--timeout", "nan"], "--timeout nan"), (["--timeout", "-1"], "--timeout -1"),
    (["--memory-mb", "0"], "--memory-mb 0"), (["--workers", "0"], "--workers 0"),
    (["--n-samples", "1000000000000"], "--n-samples must be in [1, 10000]"),
])
def test_execution_flags_out_of_range_stop_before_any_program(flags, message, tmp_path, capsys, no_programs):
    """Before: a negative timeout or no memory scored even the canonical solutions as failures."""
    with pytest.raises(SystemExit) as stop:
        load_script("eval/humaneval.py").main(["--completions", "canonical", *flags, "--out", str(tmp_path / "o.json")])
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_auto_without_os_isolation_stops_with_one_line(tmp_path, capsys, monkeypatch, no_programs):
    monkeypatch.setenv("RPT_BWRAP", str(tmp_path / "no-bwrap"))
    out = tmp_path / "out.json"
    assert load_script("eval/humaneval.py").main(["--completions", "canonical", "--out", str(out)]) == 2
    line = one_error_line(capsys)
    assert "make setup" in line and "--isolation none" in line
    assert not out.exists()


@pytest.mark.parametrize("answer, field", [(["#### 4"], "answer"), ({"a": 1}, "answer"), (None, "answer")])
def test_gsm8k_data_with_a_non_string_answer_is_one_line(answer, field, tmp_path, capsys):
    from rpt.evaluation import gsm8k

    data = write_lines(tmp_path / "test.jsonl", [{"question": "1 + 3?", "answer": "4\n#### 4"},
                                                 {"question": "2 + 2?", "answer": answer}])
    with pytest.raises(gsm8k.EvalInputError, match=rf"{data}:2: {field} must be a string"):
        gsm8k.load_gsm8k(data)
    out = tmp_path / "out.json"
    assert load_script("eval/gsm8k.py").main(["--data", str(data), "--completions", "gold", "--out", str(out)]) == 2
    assert f"{data}:2" in one_error_line(capsys)


OVERFLOW = ("    import gc, os, time\n"
            "    job = next(o for o in gc.get_objects() if isinstance(o, dict) and 'result_fd' in o)\n"
            "    prefix = b'{\"v\":' if job['mode'] == 'serve' else b'{\"i\":0,\"v\":'\n"
            "    os.write(int(job['result_fd']), prefix + b'{\"$t\":\"complex\",\"v\":[1' + b'0' * 400 + b',0]}}\\n')\n"
            "    time.sleep(30)\n")


@pytest.mark.parametrize("script, extra, task", SCRIPTS[:2])
def test_a_hostile_value_fails_its_item_and_the_report_is_written(script, extra, task, tmp_path):
    """Before: this payload raised OverflowError in the parent, exit 1, no report, nothing stored."""
    from rpt.evaluation import humaneval as he

    canonical = he.load_problems()[task]["canonical_solution"]
    path = write_lines(tmp_path / "c.jsonl", [{"task_id": task, "completion": OVERFLOW},
                                              {"task_id": task, "completion": canonical}])
    out = tmp_path / "out.json"
    args = [*extra, "--completions", str(path), "--out", str(out), "--workers", "2", "--timeout", "5"]
    assert load_script(script).main(args) == 0
    results = json.loads(out.read_text())["results"]
    assert [r["passed"] for r in results] == [False, True], results
    assert out.with_suffix(".md").is_file() and out.with_suffix(".png").is_file()
    stored = [json.loads(line) for line in out.with_name("out.items.jsonl").read_text().splitlines()]
    assert len(stored) == 2  # the hostile item is kept: a rerun does not run it again
    assert load_script(script).main(args) == 0


# ---- every evaluation script: devices, outputs, files and flags, one line before any work ------------
def _script_argv(script: str, tmp_path: Path) -> list[str]:
    """A run of ``script`` that would generate, on a checkpoint that does not exist: a flag refused
    first proves it was checked before anything was loaded."""
    absent = str(tmp_path / "absent")
    return {"eval/humaneval.py": ["--checkpoint", absent, "--out", str(tmp_path / "o" / "he.json")],
            "eval/gsm8k.py": ["--checkpoint", absent, "--out", str(tmp_path / "o" / "g.json")],
            "eval/repetition.py": ["--checkpoint", absent, "--out", str(tmp_path / "o" / "r.json")],
            "eval/error_analysis.py": ["--checkpoint", absent, "--out", str(tmp_path / "o" / "ea.json")],
            "eval/table1.py": ["--checkpoint", absent, "--out", str(tmp_path / "o" / "t1")]}[script]


EVAL_SCRIPTS = ["eval/humaneval.py", "eval/gsm8k.py", "eval/repetition.py", "eval/error_analysis.py", "eval/table1.py"]


@pytest.mark.parametrize("script", EVAL_SCRIPTS)
@pytest.mark.parametrize("device, message", [("meta", "not a device to run a model on"),
                                             pytest.param("cuda", "no cuda device visible", marks=pytest.mark.skipif(
                                                 __import__("torch").cuda.is_available(), reason="a GPU is visible"))])
def test_a_device_this_machine_lacks_is_one_line(script, device, message, tmp_path, capsys):
    """Before: --device meta / cuda without a GPU ended in a traceback after the model was read."""
    assert load_script(script).main([*_script_argv(script, tmp_path), "--device", device]) == 2
    assert message in one_error_line(capsys) and not (tmp_path / "o").exists()


@pytest.mark.parametrize("script", ["eval/repetition.py", "eval/error_analysis.py", "eval/table1.py",
                                    "eval/synthetic.py"])
def test_an_out_that_cannot_be_written_stops_before_any_work(script, tmp_path, capsys):
    """A folder where the report file goes (Table 1: a file where its folder goes); before, the
    error analysis and the repetition study ran to the end and then failed writing."""
    target = tmp_path / "taken"
    target.write_text("keep me") if script == "eval/table1.py" else target.mkdir()
    argv = (["--trials", "2"] if script == "eval/synthetic.py" else _script_argv(script, tmp_path)[:2])
    assert load_script(script).main([*argv, "--out", str(target)]) == 2
    line = one_error_line(capsys)
    assert str(target) in line and ("is a file" in line or "is a directory" in line), line
    assert (target.read_text() == "keep me") if target.is_file() else not any(target.iterdir())


@pytest.mark.parametrize("script, flags, message", [
    ("eval/repetition.py", ["--families", "lzz"], "--families lzz: not a family of the study"),
    ("eval/repetition.py", ["--min-repeats", "0"], "--min-repeats 0 is invalid"),
    ("eval/table1.py", ["--windows", "1"], "--windows 1 is invalid"),
    ("eval/table1.py", ["--confidence", "2"], "--confidence 2.0 is invalid"),
    ("eval/table1.py", ["--temperatures", "nan"], "--temperatures nan is invalid"),
    ("eval/error_analysis.py", ["--confidence", "nan"], "--confidence nan"),
])
def test_a_flag_out_of_range_is_one_line_before_loading(script, flags, message, tmp_path, capsys):
    assert load_script(script).main([*_script_argv(script, tmp_path), *flags]) == 2
    assert message in one_error_line(capsys)


def test_synthetic_sizes_past_memory_are_one_line(tmp_path, capsys):
    out = tmp_path / "s.json"
    assert load_script("eval/synthetic.py").main(["--vocab", "100000", "--out", str(out)]) == 2
    assert "--trials x --vocab^2 <= 2^26" in one_error_line(capsys) and not out.exists()


def test_non_utf8_inputs_are_named_by_path(tmp_path, capsys):
    """The error analysis' --text-file (before: decoded with replacement characters, silently) and a
    resume store that is not UTF-8 (before: a codec message naming no file)."""
    text = tmp_path / "doc.txt"
    text.write_bytes(b"def f():\n    return '\xff'\n")
    argv = _script_argv("eval/error_analysis.py", tmp_path)
    assert load_script("eval/error_analysis.py").main([*argv, "--text-file", str(text)]) == 2
    assert f"{text}: not UTF-8 text (byte 22)" in one_error_line(capsys)
    out = tmp_path / "he.json"
    (tmp_path / "he.items.jsonl").write_bytes(b'{"id": "\xff"}\n')
    assert load_script("eval/humaneval.py").main(["--completions", "canonical", "--limit", "1", "--out", str(out),
                                                  "--isolation", "none"]) == 2
    assert f"{tmp_path / 'he.items.jsonl'}: not UTF-8 text" in one_error_line(capsys) and not out.exists()


def test_an_evalplus_file_evalplus_cannot_read_is_one_line_naming_it(tmp_path):
    """Before: a corrupt or hand-edited release file ended in BadGzipFile / KeyError tracebacks."""
    import gzip

    (tmp_path / plus.FILES["humaneval"]).write_bytes(b"not gzip \xff")
    with gzip.open(tmp_path / plus.FILES["mbpp"], "wt") as f:
        f.write(json.dumps({"task_id": "Mbpp/2", "prompt": "x"}) + "\n")
    for dataset, says in (("humaneval", "BadGzipFile"), ("mbpp", "KeyError")):
        with pytest.raises(plus.EvalInputError, match=f"{tmp_path / plus.FILES[dataset]}: evalplus cannot read it .*{says}"):
            plus.load_tasks(dataset, tmp_path)
