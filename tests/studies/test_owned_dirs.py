"""Studies never delete or reuse a directory they did not write (rpt.studies.owned_dirs): a user's files in the
work directory survive, and the refusal is one line, before any work."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import pytest

from rpt.studies import owned_dirs
from rpt.studies.agreement import run as runner
from rpt.studies.agreement import source as ag
from rpt.studies.controlled import run as controlled_run
from tests.helpers.scripts import load_script


def test_claim_and_remove_only_what_is_marked(tmp_path):
    mine = owned_dirs.claim(tmp_path / "a" / "mine", "study")
    (mine / "model.bin").write_text("x")
    owned_dirs.remove(mine, "study")
    assert not mine.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    owned_dirs.fresh(empty, "study")
    assert owned_dirs.owned(empty)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    for act in (owned_dirs.remove, owned_dirs.claim, owned_dirs.fresh):
        with pytest.raises(owned_dirs.ForeignDirectory, match=f"{foreign} is not empty and was not written by the study"):
            act(foreign, "study")
    assert (foreign / "notes.txt").read_text() == "mine" and not owned_dirs.owned(foreign)
    (tmp_path / "file").write_text("f")
    with pytest.raises(owned_dirs.ForeignDirectory, match="is a file"):
        owned_dirs.remove(tmp_path / "file", "study")
    owned_dirs.remove(tmp_path / "absent", "study")  # nothing there: nothing to do


@pytest.mark.parametrize("where", ["source/my_dataset.txt", "ntp_s9/notes.txt", "rpt_q0.3_s9/notes.txt"])
def test_agreement_refuses_a_work_directory_with_foreign_files(tmp_path, capsys, where):
    script = load_script("eval/agreement.py")
    work = tmp_path / "work"
    user_file = work / where
    user_file.parent.mkdir(parents=True)
    user_file.write_text("the user's")
    before = sorted(p.relative_to(work) for p in work.rglob("*"))
    out = tmp_path / "o.json"
    assert script.main(["--source-seed", "3", "--seeds", "9", "--steps", "2", "--work", str(work), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(user_file.parent) in err[0] and owned_dirs.MARKER in err[0]
    assert user_file.read_text() == "the user's" and sorted(p.relative_to(work) for p in work.rglob("*")) == before
    assert not out.exists()


def test_agreement_rewrites_its_own_directories_only(tmp_path):
    work = tmp_path / "work"
    small = dataclasses.replace(ag.Design(), source_seed=5, train_docs=8, val_docs=4, contexts=4)
    files = runner.prepare_source(work, small)
    assert owned_dirs.owned(files.dir)
    (Path(files.dir) / "scratch.txt").write_text("inside the study's directory: goes with it")
    old_run = owned_dirs.claim(work / "ntp_s3", runner.OWNER)
    (work / "ntp_s3x").mkdir()
    (work / "ntp_s3x" / "keep.txt").write_text("not the study's")
    with pytest.raises(runner.Refused, match="ntp_s3x"):
        runner.check_work(work, dataclasses.replace(small, source_seed=6), [])
    (work / "ntp_s3x" / "keep.txt").unlink()
    runner.prepare_source(work, dataclasses.replace(small, source_seed=6))  # another source: old runs go
    assert not old_run.exists() and not (Path(files.dir) / "scratch.txt").exists() and owned_dirs.owned(files.dir)


def test_controlled_runs_refuse_foreign_run_directories_before_training(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(controlled_run.subprocess, "Popen", lambda *a, **k: started.append(a))
    jobs = [controlled_run.TrainJob("c.yaml", tmp_path / f"run{i}", []) for i in range(2)]
    owned_dirs.claim(jobs[0].run_dir, "controlled study")
    (jobs[1].run_dir).mkdir()
    (jobs[1].run_dir / "notes.txt").write_text("mine")
    with pytest.raises(owned_dirs.ForeignDirectory, match="run1"):
        controlled_run.run_jobs(jobs, 1)
    assert not started and (jobs[1].run_dir / "notes.txt").exists()


def test_controlled_study_and_sweep_refuse_a_foreign_source(tmp_path, capsys):
    script = load_script("eval/controlled.py")
    for argv, work in ((["--out", str(tmp_path / "c" / "c.json")], tmp_path / "c"),
                       (["--sweep", "--work", str(tmp_path / "s"), "--out", str(tmp_path / "s.json")], tmp_path / "s")):
        (work / "source").mkdir(parents=True)
        (work / "source" / "my_dataset.txt").write_text("mine")
        assert script.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "my_dataset" not in err[0] and str(work / "source") in err[0]
        assert sorted(p.name for p in work.rglob("*")) == ["my_dataset.txt", "source"]


def test_demo_refuses_a_foreign_output_directory(tmp_path, capsys):
    from rpt.demo import protocol as cli

    (tmp_path / "mine.txt").write_text("x")
    assert cli.main(["--out", str(tmp_path)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]


@pytest.mark.parametrize("argv,flag", [(["--source-seed", "-1"], "--source-seed -1"), (["--steps", "0"], "--steps 0"),
                                       (["--steps", "-5"], "--steps -5"), (["--contexts", "1"], "--contexts 1"),
                                       (["--train-docs", "0"], "--train-docs 0"), (["--parallel", "0"], "--parallel 0"),
                                       (["--seeds", "-2"], "--seeds -2"), (["--seeds", "7", "7"], "repeats a seed"),
                                       (["--steps", "x"], "invalid int value")])
def test_agreement_arguments_checked_before_any_work(tmp_path, capsys, argv, flag):
    script = load_script("eval/agreement.py")
    work = tmp_path / "work"
    with pytest.raises(SystemExit) if "x" in argv else contextlib.nullcontext():
        assert script.main(["--source-seed", "3", "--seeds", "9", *argv, "--work", str(work), "--out",
                            str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0] and not work.exists()


def test_agreement_out_naming_a_folder_refused_before_any_work(tmp_path, capsys):
    script = load_script("eval/agreement.py")
    (tmp_path / "results").mkdir()
    for out in (tmp_path / "results", tmp_path / "r.json"):
        if out.suffix:
            (tmp_path / "r.md").mkdir()  # a sibling the report writes, taken by a folder
        assert script.main(["--source-seed", "3", "--seeds", "9", "--steps", "1", "--work", str(tmp_path / "work"),
                            "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is a directory" in err[0] and not (tmp_path / "work").exists()
    with pytest.raises(runner.Refused, match="at least 1 step"):
        runner.run(dataclasses.replace(ag.Design(), source_seed=3), [9], tmp_path / "work", steps=0)
    assert not (tmp_path / "work").exists()



@pytest.mark.parametrize("flag", ["--pretrain-steps", "--finetune-steps", "--theory-steps", "--humaneval-limit"])
def test_demo_refuses_step_counts_below_one_before_any_work(tmp_path, capsys, flag):
    from rpt.demo import protocol as cli

    with pytest.raises(SystemExit):
        cli.main(["--out", str(tmp_path / "demo"), flag, "0"])
    assert f"{flag} 0: must be at least 1" in capsys.readouterr().err and not (tmp_path / "demo").exists()


def test_a_work_path_that_is_a_file_is_refused_before_any_work(tmp_path, capsys):
    (tmp_path / "work").write_text("a file")
    agreement, controlled = load_script("eval/agreement.py"), load_script("eval/controlled.py")
    assert agreement.main(["--source-seed", "3", "--seeds", "9", "--work", str(tmp_path / "work"),
                           "--out", str(tmp_path / "o.json")]) == 2
    assert "is a file" in capsys.readouterr().err
    assert controlled.main(["--sweep", "--work", str(tmp_path / "work"), "--out", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a file" in err[0] and (tmp_path / "work").read_text() == "a file"
