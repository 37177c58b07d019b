"""The code and GSM8K scripts on bad input: one ``error:`` line naming the file, the line and
the field, exit status 2, before any program runs and with nothing written; ``--limit`` means
"the first N task ids of the completions" in every benchmark; and a hostile completion fails
its own item only, the run writing its report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rpt import sandbox
from rpt.benchmarks import plus
from tests.scripts import load_script

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

    monkeypatch.setattr(sandbox._Child, "__init__", refuse)


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
# that used to fail as "unhashable" and a non-UTF-8 line
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
    assert "is a folder" in one_error_line(capsys)
    file = tmp_path / "file"
    file.write_text("")
    assert load_script(script).main([*extra, "--completions", "canonical", "--out", str(file / "x.json")]) == 2
    assert "is a file" in one_error_line(capsys)


@pytest.mark.parametrize("script, extra", [("eval/humaneval.py", []),
                                           pytest.param("eval/humaneval.py", ["--plus"], marks=PLUS_MISSING)])
def test_limit_means_the_first_task_ids_of_the_completions_everywhere(script, extra, tmp_path):
    from rpt.benchmarks import humaneval as he

    problems = he.load_problems()
    rows = [{"task_id": t, "completion": problems[t]["canonical_solution"]} for t in ("HumanEval/5", "HumanEval/3")]
    path = write_lines(tmp_path / "c.jsonl", rows + [rows[0]])
    out = tmp_path / "out.json"
    assert load_script(script).main([*extra, "--completions", str(path), "--limit", "1", "--out", str(out),
                                     "--workers", "1"]) == 0
    results = json.loads(out.read_text())["results"]
    assert [r["task_id"] for r in results] == ["HumanEval/5", "HumanEval/5"] and all(r["passed"] for r in results)


def test_auto_without_os_isolation_stops_with_one_line(tmp_path, capsys, monkeypatch, no_programs):
    monkeypatch.setenv("RPT_BWRAP", str(tmp_path / "no-bwrap"))
    out = tmp_path / "out.json"
    assert load_script("eval/humaneval.py").main(["--completions", "canonical", "--out", str(out)]) == 2
    line = one_error_line(capsys)
    assert "make setup" in line and "--isolation none" in line
    assert not out.exists()


@pytest.mark.parametrize("answer, field", [(["#### 4"], "answer"), ({"a": 1}, "answer"), (None, "answer")])
def test_gsm8k_data_with_a_non_string_answer_is_one_line(answer, field, tmp_path, capsys):
    from rpt.benchmarks import gsm8k

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
    from rpt.benchmarks import humaneval as he

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
