"""One default per knob across the entry points, or the difference stated in ``--help`` with its
reason: every entry point's argparse defaults are parsed and compared knob by knob; a difference
that ``rpt.sampling.entry_defaults.DIFFERENCES`` does not list (with each entry's value) fails, and a listed
one must show its reason in that entry's ``--help``. The lm-eval task's shots are read from its YAML."""

from __future__ import annotations

import io
from contextlib import redirect_stdout

import pytest
import yaml

from rpt.sampling import entry_defaults as ed
from tests.helpers.scripts import ROOT, load_script


def parsers() -> dict:
    from rpt.evaluation.benchmark_script import build_parser
    from rpt.evaluation.code_benchmarks import HumanEval, MBPPPlus
    from rpt.evaluation.gsm8k import GSM8K

    return {ed.SAMPLE: load_script("sample.py").build_parser(), ed.HUMANEVAL: build_parser(HumanEval()),
            ed.MBPP: build_parser(MBPPPlus()), ed.GSM8K: build_parser(GSM8K()),
            ed.TABLE1: load_script("eval/table1.py").build_parser()}


@pytest.fixture(scope="module")
def entry_parsers():
    return parsers()


def defaults_by_knob(entry_parsers) -> dict[str, dict[str, object]]:
    """knob -> {entry point: its argparse default}, aliases mapped to the shared knob name."""
    knobs: dict[str, dict[str, object]] = {}
    for entry, parser in entry_parsers.items():
        aliases = ed.ALIASES.get(entry, {})
        for action in parser._actions:
            if action.dest != "help":
                knobs.setdefault(aliases.get(action.dest, action.dest), {})[entry] = parser.get_default(action.dest)
    return knobs


def test_every_shared_knob_has_one_default_or_a_stated_difference(entry_parsers):
    listed = {d.knob: d for d in ed.DIFFERENCES}
    for knob, defaults in defaults_by_knob(entry_parsers).items():
        if len(defaults) < 2:
            continue
        if knob not in listed:
            assert len({repr(v) for v in defaults.values()}) == 1, f"{knob}: {defaults} differ and no reason is stated"
            continue
        for entry, value in defaults.items():
            assert value == listed[knob].default(entry), (knob, entry, value)


def test_each_stated_difference_is_real_and_explained_in_help(entry_parsers):
    for difference in ed.DIFFERENCES:
        values = {repr(difference.default(e)) for e in difference.defaults}
        assert len(values) > 1, f"{difference.knob} is listed as different but is not"
        for entry in difference.defaults:
            if entry not in entry_parsers:
                continue
            text = io.StringIO()
            with redirect_stdout(text), pytest.raises(SystemExit):
                entry_parsers[entry].parse_args(["--help"])
            # whitespace dropped: argparse wraps lines, at hyphens too
            assert "".join(difference.why.split()) in "".join(text.getvalue().split()), (entry, difference.knob)


def test_lm_eval_task_shots_are_the_tables():
    task = yaml.safe_load((ROOT / ed.LM_EVAL_TASK).read_text())
    shots = next(d for d in ed.DIFFERENCES if d.knob == "shots")
    assert task["num_fewshot"] == shots.default(ed.LM_EVAL_TASK)
    assert shots.default(ed.GSM8K) == shots.default(ed.TABLE1)


def test_dtype_auto_is_accepted_everywhere(entry_parsers):
    from rpt.cli.devices import resolve_dtype

    for entry, parser in entry_parsers.items():
        action = next(a for a in parser._actions if a.dest == "dtype")
        assert "auto" in action.choices, entry
    import torch

    assert resolve_dtype("auto", "cpu") is torch.float32 and resolve_dtype("auto", "cuda:1") is torch.bfloat16
    assert resolve_dtype("float16", "cpu") is torch.float16


def test_gsm8k_data_defaults_to_the_local_copy_in_both_scripts(tmp_path, monkeypatch):
    """eval/gsm8k.py and eval/table1.py read the same place without a data flag: the local copy, else the hub."""
    from rpt.evaluation import gsm8k
    from tests.helpers.eval_helpers import gsm8k_folder

    folder = gsm8k_folder(tmp_path / "local", n_train=2, n_test=3)
    monkeypatch.setenv("RPT_GSM8K_DIR", str(folder))
    assert gsm8k.data_source(None, "test") == str(folder / "test.jsonl")
    assert gsm8k.data_source(None, "train") == str(folder / "train.jsonl")
    assert gsm8k.data_source("hub") is None and gsm8k.data_source("x.jsonl") == "x.jsonl"
    args = load_script("eval/table1.py").build_parser().parse_args(["--checkpoint", "c"])
    from rpt.evaluation import table1

    assert "--data" not in table1.argv_for(table1.Run("gsm8k", 2, (0,)), args)  # the script's own default
    monkeypatch.setenv("RPT_GSM8K_DIR", str(tmp_path / "nothing"))
    assert gsm8k.data_source(None, "test") is None  # no local copy: the hub


def test_gsm8k_without_data_scores_the_local_copy(tmp_path, monkeypatch, capsys):
    from tests.helpers.eval_helpers import gsm8k_folder

    folder = gsm8k_folder(tmp_path / "local", n_train=2, n_test=3)
    monkeypatch.setenv("RPT_GSM8K_DIR", str(folder))
    out = tmp_path / "g.json"
    assert load_script("eval/gsm8k.py").main(["--completions", "gold", "--out", str(out)]) == 0
    import json

    summary = json.loads(out.read_text())
    assert summary["n"] == 3 and summary["accuracy"] == 1.0 and summary["data"] == str(folder / "test.jsonl")


def test_an_evaluation_runs_with_dtype_auto(tmp_path):
    """``--dtype auto`` (float32 on this CPU) in a benchmark script, as in sample.py."""
    import json

    from tests.helpers.eval_helpers import gsm8k_folder, long_context_checkpoint

    data = gsm8k_folder(tmp_path / "gsm8k", n_train=1, n_test=1)
    ckpt = long_context_checkpoint(tmp_path / "ckpt")
    out = tmp_path / "g.json"
    argv = ["--checkpoint", ckpt, "--data", str(data / "test.jsonl"), "--shots", "0", "--max-new-tokens", "3",
            "--out", str(out)]
    assert load_script("eval/gsm8k.py").main([*argv, "--dtype", "auto"]) == 0
    auto = json.loads(out.read_text())["results"]
    assert load_script("eval/gsm8k.py").main([*argv, "--dtype", "float32", "--fresh"]) == 0
    assert json.loads(out.read_text())["results"] == auto
