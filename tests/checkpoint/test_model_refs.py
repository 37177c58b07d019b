"""One resolver of model references (rpt/checkpoint/model_ref.py) behind every entry point: a local
directory, a path that does not exist, a hub id cached or not (offline), each decided before any
work; the evaluation scripts report a bad ``--checkpoint`` in one line through it."""

import pytest

from rpt.checkpoint.model_ref import ModelRefError, looks_like_path, resolve_model_ref
from tests.helpers.scripts import load_script


def fake_hub_cache(root, repo_id: str) -> None:
    """The layout huggingface_hub writes for a downloaded model: refs/main -> snapshots/<sha>/."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")


@pytest.fixture()
def offline_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    fake_hub_cache(tmp_path / "hub", "some-org/cached-model")
    fake_hub_cache(tmp_path / "hub", "cached-bare")
    return tmp_path


@pytest.mark.parametrize("ref, is_path", [("gpt2", False), ("org/name", False), ("runs/x/final", True),
                                          ("./x", True), ("/abs/x", True), ("~/x", True), ("x/", True)])
def test_what_only_a_path_could_mean(ref, is_path):
    assert looks_like_path(ref) is is_path


def test_resolution(offline_cache, monkeypatch):
    local = offline_cache / "local_model"
    local.mkdir()
    monkeypatch.chdir(offline_cache)
    assert resolve_model_ref(str(local), "x") == str(local)
    assert resolve_model_ref("local_model", "x") == "local_model"  # an existing directory wins over a hub id
    assert resolve_model_ref("some-org/cached-model", "x") == "some-org/cached-model"
    assert resolve_model_ref("cached-bare", "x") == "cached-bare"
    cases = {
        "gpt2-not-cached": "not in the local hub cache",
        "org/not-cached": "no local directory 'org/not-cached' exists",
        "runs/missing/final": "does not exist (no such directory); FIX",
        "bad id!": "neither an existing directory nor a valid hub id",
    }
    for ref, expect in cases.items():
        with pytest.raises(ModelRefError, match="^WHAT ") as e:
            resolve_model_ref(ref, "WHAT", "FIX")
        assert expect in str(e.value) and "\n" not in str(e.value), str(e.value)
    (offline_cache / "a_file").write_text("x")
    with pytest.raises(ModelRefError, match="is a file, not a model directory"):
        resolve_model_ref("a_file", "WHAT")


@pytest.mark.parametrize("script, extra", [
    ("eval/table1.py", []),
    ("eval/error_analysis.py", []),
    ("eval/gsm8k.py", ["--data", "gsm8k.jsonl", "--shots", "1"]),
    ("eval/repetition.py", []),
])
@pytest.mark.parametrize("ref, expect", [("runs/none/final", "does not exist"),
                                         ("not-a-model-rpt-test", "not in the local hub cache")])
def test_eval_scripts_report_a_bad_checkpoint_in_one_line(tmp_path, capsys, monkeypatch, script, extra, ref, expect):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    for name in ("gsm8k.jsonl", "train.jsonl"):  # a valid split, so only the checkpoint is wrong
        (tmp_path / name).write_text('{"question": "1 + 1?", "answer": "1 + 1 = 2\\n#### 2"}\n')
    code = load_script(script).main(["--checkpoint", ref, *extra, "--out", str(tmp_path / "out" / "r.json")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and err[0].startswith("error:") and expect in err[0], err
    assert "Repo id must be" not in err[0]


def test_prepare_data_checks_its_tokenizer_source_and_output_first(tmp_path, capsys, monkeypatch):
    from tests.helpers.train_helpers import write_config

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = write_config(tmp_path)
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for argv, expect in ((["init_from=runs/none/final", "tokenizer=null"], "'init_from' = 'runs/none/final' does not exist"),
                         (["--out", str(a_file / "x")], "cannot be created")):
        assert load_script("prepare_data.py").main(["--config", cfg, *argv]) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and err[0].startswith("error:") and expect in err[0], err
    assert not (tmp_path / "cache").exists()
