"""The scripts' front (rpt/cli/, rpt/errors.py) and the one atomic writer (rpt.result_files.write_atomic),
each against an independent truth: the json module's bytes, a plain open's permissions, argparse's parse,
the source's class statements."""

from __future__ import annotations

import ast
import json
import os
import stat

import pytest

from rpt.cli import output_paths
from rpt.cli.devices import DTYPE_CHOICES, DTYPES
from rpt.cli.parser import report_input_error
from rpt.result_files import write_atomic
from tests.helpers.scripts import ROOT, load_script


def test_the_writer_writes_bytes_text_and_through_a_function(tmp_path):
    target = tmp_path / "deep" / "f.bin"  # a missing directory is created
    write_atomic(target, b"\x00\xff")
    assert target.read_bytes() == b"\x00\xff"
    write_atomic(target, "é\n")
    assert target.read_bytes() == b"\xc3\xa9\n"  # UTF-8
    write_atomic(target, lambda handle: handle.write(b"abc"))
    assert target.read_bytes() == b"abc" and os.listdir(target.parent) == ["f.bin"]


def test_a_write_that_fails_midway_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "f.json"
    target.write_text("old")

    def half_then_fail(handle):
        handle.write(b'{"half": ')
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, half_then_fail)
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["f.json"]


def test_the_file_gets_the_permissions_a_plain_open_gives(tmp_path):
    plain = tmp_path / "plain"
    with open(plain, "w"):
        pass
    write_atomic(tmp_path / "atomic", "x")
    assert stat.S_IMODE(os.stat(tmp_path / "atomic").st_mode) == stat.S_IMODE(os.stat(plain).st_mode)


def test_the_checkpoint_records_keep_their_bytes(tmp_path):
    from rpt.checkpoint.directories import write_json_atomic

    data = {"step": 3, "path": tmp_path, "é": [1.5, None]}
    write_json_atomic(str(tmp_path / "r.json"), data)
    expected = tmp_path / "expected.json"
    with open(expected, "w") as f:
        json.dump(data, f, indent=2, default=str)
    assert (tmp_path / "r.json").read_bytes() == expected.read_bytes()


def dtype_parsers() -> dict:
    from rpt.evaluation.benchmark_script import build_parser
    from rpt.evaluation.code_benchmarks import HumanEval, MBPPPlus
    from rpt.evaluation.gsm8k import GSM8K

    return {"sample.py": load_script("sample.py").build_parser(), "eval/humaneval.py": build_parser(HumanEval()),
            "eval/mbpp.py": build_parser(MBPPPlus()), "eval/gsm8k.py": build_parser(GSM8K()),
            "eval/table1.py": load_script("eval/table1.py").build_parser(),
            "eval/repetition.py": load_script("eval/repetition.py").build_parser()}


def test_every_entry_point_takes_the_one_dtype_list():
    assert DTYPE_CHOICES == ("auto", "float32", "bfloat16", "float16") and DTYPES == DTYPE_CHOICES[1:]
    for entry, parser in dtype_parsers().items():
        base = ["--checkpoint", "c", "--prompt", "x"] if entry == "sample.py" else ["--checkpoint", "c"]
        for dtype in DTYPE_CHOICES:
            assert parser.parse_args([*base, "--dtype", dtype]).dtype == dtype, entry
        with pytest.raises(SystemExit):
            parser.parse_args([*base, "--dtype", "float64"])


def test_lm_eval_model_args_take_the_dtypes_without_auto():
    from rpt.errors import ModelArgsError
    from rpt.evaluation.lm_eval_args import dtype_of

    assert [dtype_of(d) for d in DTYPES] == list(DTYPES)
    for bad in ("auto", "float64"):
        with pytest.raises(ModelArgsError, match="dtype"):
            dtype_of(bad)


@pytest.mark.parametrize("make, how, refused", [
    (lambda d: d / "new" / "f.json", {}, None),  # parents are created
    (lambda d: d / "new" / "f.json", {"create_parents": False}, "does not exist"),
    (lambda d: d / "dir", {}, "is a directory"),
    (lambda d: d / "r.json", {"siblings": (".md",)}, "r.md"),  # a sibling the report writes is a directory
    (lambda d: d / "file" / "f.json", {}, "is a file"),
    (lambda d: d / "file", {"directory": True}, "is a file, not a directory"),
    (lambda d: d / "dir" / "sub", {"directory": True}, None),
    (lambda d: d / "file" / "sub", {"directory": True}, "cannot be created"),
])
def test_the_one_output_check(tmp_path, make, how, refused):
    (tmp_path / "dir").mkdir()
    (tmp_path / "r.md").mkdir()
    (tmp_path / "file").write_text("")
    problem = output_paths.output_problem(str(make(tmp_path)), "--out", **how)
    assert problem is None if refused is None else (refused in problem and problem.startswith("--out ")), problem


def test_an_unwritable_directory_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("this user writes anywhere (root)")
        assert "not writable" in output_paths.output_problem(str(locked / "f.json"), "--out")
    finally:
        locked.chmod(0o700)


def test_the_exit_is_one_line_and_status_2(capsys, monkeypatch):
    monkeypatch.delenv("RPT_TRACEBACK", raising=False)
    assert report_input_error(ValueError("bad\n  thing"), traceback_hint=False) == 2
    assert capsys.readouterr().err == "error: bad thing\n"
    assert report_input_error(ValueError("x")) == 2
    assert capsys.readouterr().err == "error: x (set RPT_TRACEBACK=1 for the traceback)\n"


def error_classes() -> dict[str, list[str]]:
    """``{class name: its bases}`` of every ``class *Error(...)`` statement under rpt/, read from the source."""
    found = {}
    for path in (ROOT / "rpt").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error"):
                found[node.name] = [ast.unparse(b) for b in node.bases]
    return found


def test_every_user_input_error_is_an_input_error():
    """Only the sandbox's wire protocol error (a child's message, not a user's input) stands apart."""
    import rpt.errors

    classes = error_classes()
    assert {name for name, bases in classes.items() if "InputError" not in bases} == {"InputError", "WireError"}
    for name in classes:
        if name != "WireError":
            cls = getattr(rpt.errors, name)
            assert issubclass(cls, rpt.errors.InputError) and issubclass(cls, ValueError)


def test_each_error_is_caught_where_its_users_catch_it():
    from rpt.checkpoint.directories import CheckpointError
    from rpt.checkpoint.model_ref import ModelRefError
    from rpt.data import DataError
    from rpt.errors import InputError
    from rpt.evaluation.lm_eval_args import ModelArgsError
    from rpt.evaluation.user_jsonl import EvalInputError
    from rpt.integrations.vllm_rpt.settings import RPTSettingError
    from rpt.sampling.text.chat import ChatTemplateError
    from rpt.training.config import ConfigError

    for cls in (CheckpointError, ModelRefError, DataError, ModelArgsError, EvalInputError, RPTSettingError,
                ChatTemplateError, ConfigError):
        assert issubclass(cls, InputError)


def test_a_study_command_checks_out_before_running_and_refusals_are_one_line(tmp_path, capsys):
    from rpt.cli.study_command import run_study

    class Refused(Exception):
        pass

    ran = []

    def write(out, summary):
        (tmp_path / "r.md").write_text(f"# {summary}\n")
        return [out, tmp_path / "r.md"]

    (tmp_path / "taken.md").mkdir()
    assert run_study(str(tmp_path / "taken.json"), (".md",), lambda: ran.append(1), write, Refused) == 2
    assert ran == [] and "is a directory" in capsys.readouterr().err
    assert run_study(str(tmp_path / "r.json"), (), lambda: ran.append(1), write, Refused, check=lambda: "bad work") == 2
    assert ran == [] and capsys.readouterr().err == "error: bad work\n"

    def refused():
        raise Refused("not registered")

    assert run_study(str(tmp_path / "r.json"), (), refused, write, Refused) == 2
    assert capsys.readouterr().err == "error: not registered\n"
    assert run_study(str(tmp_path / "r.json"), (".md",), lambda: "done", write, Refused) == 0
    assert capsys.readouterr().out == f"# done\n\nwrote {tmp_path / 'r.json'}, {tmp_path / 'r.md'}\n"
