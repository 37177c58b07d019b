"""The pre-registration guard compares contents, not ``git status``: hidden edits, uncommitted and
committed changes of registered fields are refused; keys added in a later commit are recorded."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rpt.studies.preregistration import NotPreregistered, Registration, changed_fields, check_preregistered

DOC, CONFIG = "docs/prereg.md", "configs/study.yaml"
CONFIG_TEXT = "# the protocol\nlr: 3.0e-3\nmax_steps: 1400\nmodel:\n  hidden_size: 64\n"


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def commit_all(root: Path, message: str) -> str:
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", message)
    return git(root, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path) -> tuple[Path, Registration]:
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "configs").mkdir()
    git(root, "init", "-q")
    (root / DOC).write_text("P1: the gain is negative\n")
    (root / CONFIG).write_text(CONFIG_TEXT)
    (root / "notes.txt").write_text("registered notes\n")
    registered = commit_all(root, "register")
    (root / "code.py").write_text("later work\n")
    commit_all(root, "later")
    return root, Registration(DOC, registered, (CONFIG,), fix="develop with other seeds")


def refusal(root: Path, reg: Registration) -> str:
    with pytest.raises(NotPreregistered) as err:
        check_preregistered(root, reg)
    message = str(err.value)
    assert "\n" not in message and message.endswith("develop with other seeds")
    return message


def test_clean_registration_is_recorded(repo):
    root, reg = repo
    record = check_preregistered(root, reg)
    assert record["commit"] == reg.commit and record["head"] == git(root, "rev-parse", "HEAD")
    assert record["protocol"][CONFIG]["added_after_registration"] == {}
    import hashlib
    assert record["sha256"] == hashlib.sha256(b"P1: the gain is negative\n").hexdigest()


@pytest.mark.parametrize("hide,path,edit", [
    ("--assume-unchanged", DOC, "P1: the gain is positive\n"),  # the seen cases
    (None, CONFIG, CONFIG_TEXT.replace("3.0e-3", "1.0e-2")),
    ("--skip-worktree", CONFIG, CONFIG_TEXT.replace("3.0e-3", "1.0e-2")),  # their class: any hiding, any edit
    ("--assume-unchanged", CONFIG, CONFIG_TEXT + "label_smoothing: 0.1\n"),
    (None, DOC, "P1: the gain is negative\n\n")])
def test_uncommitted_edits_are_refused_even_hidden_from_git_status(repo, hide, path, edit):
    root, reg = repo
    (root / path).write_text(edit)
    if hide:
        git(root, "update-index", hide, path)
        assert git(root, "status", "--porcelain") == ""  # what the old guard read: nothing to see
    assert "differs from its committed version at HEAD" in refusal(root, reg)


def test_staged_edit_is_refused(repo):
    root, reg = repo
    (root / CONFIG).write_text(CONFIG_TEXT.replace("1400", "10"))
    git(root, "add", CONFIG)
    assert "differs from its committed version" in refusal(root, reg)


def test_committed_changes_of_registered_fields_are_refused(repo):
    root, reg = repo
    (root / DOC).write_text("P1: the gain is positive\n")
    commit_all(root, "edit the prediction")
    assert "edited after the registration" in refusal(root, reg)
    git(root, "reset", "-q", "--hard", "HEAD~1")
    for text, field in [(CONFIG_TEXT.replace("3.0e-3", "1.0e-2"), "lr"),
                        (CONFIG_TEXT.replace("hidden_size: 64", "hidden_size: 128"), "model.hidden_size"),
                        (CONFIG_TEXT.replace("max_steps: 1400\n", ""), "max_steps (removed)")]:
        (root / CONFIG).write_text(text)
        commit_all(root, "bend the protocol")
        assert f"changed registered fields since the registration: {field}" in refusal(root, reg)
        git(root, "reset", "-q", "--hard", "HEAD~1")
    (root / CONFIG).write_text("not: [yaml\n")
    commit_all(root, "break it")
    assert "no longer parses" in refusal(root, reg)


def test_keys_added_in_a_later_commit_are_accepted_and_recorded(repo):
    root, reg = repo
    (root / CONFIG).write_text(CONFIG_TEXT.replace("# the protocol", "# the protocol, commented")
                               + "draw_keying: per_position\nmodel_extra: {a: 1}\n")
    commit_all(root, "pin the registered draws")
    record = check_preregistered(root, reg)
    assert record["protocol"][CONFIG]["added_after_registration"] == {"draw_keying": "per_position",
                                                                      "model_extra": {"a": 1}}


def test_registration_commit_must_be_in_the_history(repo, tmp_path):
    root, reg = repo
    other = Registration(DOC, "0" * 40, reg.protocol, reg.fix)
    assert "not in this repository" in refusal(root, other)
    git(root, "checkout", "-q", "--orphan", "elsewhere")
    commit_all(root, "an unrelated history")
    assert "not an ancestor of HEAD" in refusal(root, reg)
    assert "not a git work tree" in refusal(tmp_path / "nowhere", reg)


def test_protocol_files_must_be_registered_and_non_yaml_byte_identical(repo):
    root, reg = repo
    (root / "extra.txt").write_text("x\n")
    commit_all(root, "extra")
    assert "not part of the registration" in refusal(root, Registration(DOC, reg.commit, ("extra.txt",), reg.fix))
    assert "not committed in HEAD" in refusal(root, Registration(DOC, reg.commit, ("missing.yaml",), reg.fix))
    notes = Registration(DOC, reg.commit, ("notes.txt",), reg.fix)
    assert check_preregistered(root, notes)["protocol"]["notes.txt"]["added_after_registration"] == {}
    (root / "notes.txt").write_text("registered notes, edited\n")
    commit_all(root, "edit notes")
    assert "notes.txt changed registered fields since the registration: (the file's bytes)" in refusal(root, notes)


def test_changed_fields_on_hand_cases():
    assert changed_fields({"a": 1, "b": {"c": 2}}, {"a": 1, "b": {"c": 2, "d": 3}, "e": 4}) == ([], {"b.d": 3, "e": 4})
    assert changed_fields({"a": 1, "b": {"c": 2}}, {"a": 1.0, "b": {"c": 5}}) == (["b.c"], {})
    assert changed_fields([1, 2], [1, 2, 3]) == (["(the whole file)"], {})
