"""A run's record is history: a later invocation of the same output_dir never rewrites config.yaml
or final/, may change only the resumable keys (max_steps upwards), and records each segment."""

import json
import os
import shutil

import pytest
import yaml

from rpt.metrics import read_metrics
from tests.inprocess_train import one_error_line, train_main
from tests.train_helpers import write_config

# constant schedule: a run resumed with a higher max_steps trains exactly as one planned that long
FAST = dict(max_steps=4, save_every=2, keep_last=5, eval_batches=0, schedule="constant", warmup_steps=1)


def record_bytes(run) -> dict[str, bytes]:
    """Every file of the run's record and weights, byte for byte."""
    out = {}
    for root, _dirs, files in os.walk(run):
        for name in files:
            path = os.path.join(root, name)
            out[os.path.relpath(path, run)] = open(path, "rb").read()
    return out


def losses(run) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(os.path.join(run, "metrics.jsonl"))}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 4-step run (checkpoints 2 and 4, final/) and its config file."""
    tmp = tmp_path_factory.mktemp("finished")
    cfg = write_config(tmp, **FAST)
    assert train_main(cfg) == 0
    return cfg, tmp / "run"


def test_finished_run_rerun_with_another_lr_is_one_line_and_changes_no_byte(finished, capsys):
    cfg, run = finished
    before = record_bytes(run)
    capsys.readouterr()
    assert train_main(cfg, "lr=1e-2") == 2
    line = one_error_line(capsys.readouterr().err)
    assert "lr (0.003 -> 0.01)" in line and "new run" in line
    assert train_main(cfg) == 2  # the same command again: finished
    assert "is finished" in one_error_line(capsys.readouterr().err)
    assert record_bytes(run) == before


@pytest.mark.parametrize("override, key", [
    ("objective=ntp", "objective"), ("seq_len=16", "seq_len"), ("window=2", "window"), ("s=0.25", "s"),
    ("q=0.1", "q"), ("seed=5", "seed"), ("model.hidden_size=64", "model"), ("tokenizer=null", "tokenizer"),
    ("data={stdlib: {max_files: 3}}", "data"), ("weight_decay=0.0", "weight_decay"), ("schedule=cosine", "schedule"),
    ("micro_batch_size=2", "micro_batch_size"), ("lora={r: 2}", "lora"), ("precision=bf16", "precision"),
])
def test_resume_with_another_setting_names_the_key_and_writes_nothing(finished, capsys, override, key):
    cfg, run = finished
    before = record_bytes(run)
    capsys.readouterr()
    assert train_main(cfg, override, "max_steps=8") == 2
    line = one_error_line(capsys.readouterr().err)
    assert f" {key} (" in line and "checkpoint-4" in line
    assert record_bytes(run) == before


def test_max_steps_at_or_below_the_checkpoint_is_an_error(finished, capsys):
    cfg, run = finished
    before = record_bytes(run)
    capsys.readouterr()
    assert train_main(cfg, "max_steps=3") == 2
    assert "'max_steps' = 3 is at or below the step 4" in one_error_line(capsys.readouterr().err)
    assert record_bytes(run) == before


def test_lowering_max_steps_of_an_interrupted_run_is_an_error(tmp_path, capsys):
    cfg = write_config(tmp_path, **{**FAST, "max_steps": 6})
    assert train_main(cfg) == 0
    cut = tmp_path / "cut"
    os.makedirs(cut)
    shutil.copytree(tmp_path / "run" / "checkpoint-2", cut / "checkpoint-2")
    capsys.readouterr()
    assert train_main(cfg, f"output_dir={cut}", "max_steps=4") == 2
    assert "below the run's max_steps 6" in one_error_line(capsys.readouterr().err)


def test_resume_raising_max_steps_continues_exactly_and_records_the_segment(tmp_path):
    cfg = write_config(tmp_path, **FAST)
    ref = tmp_path / "ref"
    assert train_main(cfg, f"output_dir={ref}", "max_steps=6") == 0
    run = tmp_path / "run"
    assert train_main(cfg) == 0
    config_yaml = (run / "config.yaml").read_bytes()
    assert train_main(cfg, "max_steps=6", "eval_every=3", "log_every=2") == 0
    assert (run / "config.yaml").read_bytes() == config_yaml  # the record of how the run started
    assert yaml.safe_load((run / "final" / "training_config.yaml").read_text())["max_steps"] == 6
    a, b = losses(ref), losses(run)
    # a constant schedule: the extension trains what a 6-step run trained (logged every 2 steps: the mean)
    assert sorted(b) == [1, 2, 3, 4, 6] and b[6] == pytest.approx((a[5] + a[6]) / 2, rel=1e-6)
    segments = [json.loads(line) for line in (run / "segments.jsonl").read_text().splitlines()]
    assert [(s["from_step"], s["max_steps"]) for s in segments] == [(0, 4), (4, 6)]
    assert segments[0]["from_checkpoint"] is None and segments[1]["from_checkpoint"] == str(run / "checkpoint-4")
    assert segments[1]["changed"] == {"max_steps": {"from": 4, "to": 6}, "eval_every": {"from": 5, "to": 3},
                                      "log_every": {"from": 1, "to": 2}}
    assert json.loads((run / "final" / "segments.json").read_text()) == segments


def test_resume_none_over_a_run_is_refused(finished, capsys):
    cfg, run = finished
    before = record_bytes(run)
    capsys.readouterr()
    assert train_main(cfg, "resume=none") == 2
    assert "'resume' = 'none'" in one_error_line(capsys.readouterr().err)
    assert record_bytes(run) == before


def test_output_dir_naming_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    cfg = write_config(tmp_path, **FAST)
    assert train_main(cfg, f"output_dir={tmp_path / 'afile'}") == 2
    assert "'output_dir'" in one_error_line(capsys.readouterr().err)


def test_resume_may_turn_gradient_checkpointing_on_and_records_it(tmp_path):
    """How a step is executed is not what it computes: an OOM on resume is met by checkpointing."""
    cfg = write_config(tmp_path, **FAST)
    ref = tmp_path / "ref"
    assert train_main(cfg, f"output_dir={ref}", "max_steps=6") == 0
    run = tmp_path / "run"
    assert train_main(cfg) == 0
    assert train_main(cfg, "max_steps=6", "gradient_checkpointing=true") == 0
    assert losses(run)[6] == pytest.approx(losses(ref)[6], rel=1e-5)
    segments = [json.loads(line) for line in (run / "segments.jsonl").read_text().splitlines()]
    assert segments[1]["changed"]["gradient_checkpointing"] == {"from": False, "to": True}
