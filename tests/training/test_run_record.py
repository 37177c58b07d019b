"""A run's record is history: a later invocation of the same output_dir never rewrites config.yaml
or final/, may change only the resumable keys (max_steps upwards), and records each segment.
Its files read back (rpt/append_log.py, rpt/training/run_dir/file_checks.py): a torn last line is dropped and said,
damage anywhere else is one error naming the file and the line, train.log and metrics.jsonl agree
about the steps after a resume, a directory where a record file goes is one line."""

import json
import os
import shutil

import pytest
import yaml

from rpt.append_log import read_log
from rpt.training.config import ConfigError
from rpt.training.measure.metrics import read_metrics
from rpt.training.run_dir.log import RunLog, read_train_log, step_line
from tests.helpers.inprocess_train import one_error_line, train_main
from tests.helpers.train_helpers import write_config

# constant schedule: a run resumed with a higher max_steps trains exactly as one planned that long
FAST = dict(max_steps=4, save_every=2, keep_last=5, eval_batches=0, schedule="constant", warmup_steps=1)


def record_bytes(run) -> dict[str, bytes]:
    """Every file of the run's record and weights, byte for byte."""
    out = {}
    for root, _dirs, files in os.walk(run):
        for name in files:
            path = os.path.join(root, name)
            out[os.path.relpath(path, run)] = open(path, "rb").read() if os.path.isfile(path) else "not a file"
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


@pytest.fixture
def fast_config(finished, tmp_path):
    """``write_config(tmp_path, **FAST)`` reading the finished run's cache: its tokenizer and token store
    are built once per module (the same config's data, keyed by its content)."""
    def make(**overrides) -> str:
        return write_config(tmp_path, **{**FAST, "cache_dir": str(finished[1].parent / "cache"), **overrides})
    return make


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


def test_lowering_max_steps_of_an_interrupted_run_is_an_error(tmp_path, fast_config, capsys):
    cfg = fast_config(max_steps=6)
    assert train_main(cfg) == 0
    cut = tmp_path / "cut"
    os.makedirs(cut)
    shutil.copytree(tmp_path / "run" / "checkpoint-2", cut / "checkpoint-2")
    capsys.readouterr()
    assert train_main(cfg, f"output_dir={cut}", "max_steps=4") == 2
    assert "below the run's max_steps 6" in one_error_line(capsys.readouterr().err)


def test_resume_raising_max_steps_continues_exactly_and_records_the_segment(tmp_path, fast_config):
    cfg = fast_config()
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


def test_resume_may_turn_gradient_checkpointing_on_and_records_it(tmp_path, fast_config):
    """How a step is executed is not what it computes: an OOM on resume is met by checkpointing."""
    cfg = fast_config()
    ref = tmp_path / "ref"
    assert train_main(cfg, f"output_dir={ref}", "max_steps=6") == 0
    run = tmp_path / "run"
    assert train_main(cfg) == 0
    assert train_main(cfg, "max_steps=6", "gradient_checkpointing=true") == 0
    assert losses(run)[6] == pytest.approx(losses(ref)[6], rel=1e-5)
    segments = [json.loads(line) for line in (run / "segments.jsonl").read_text().splitlines()]
    assert segments[1]["changed"]["gradient_checkpointing"] == {"from": False, "to": True}


# ---- the record's files read back -------------------------------------------------------------------
def copy_run(finished, tmp_path):
    cfg, run = finished
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return cfg, copy


def log_steps(run) -> list[int]:
    return [step for step, _ in read_train_log(str(run / "train.log")).items]


def test_torn_last_lines_are_dropped_and_train_log_is_rebuilt_to_agree_with_the_metrics(finished, tmp_path, capsys):
    cfg, run = copy_run(finished, tmp_path)
    lines = (run / "train.log").read_text().splitlines()
    # a kill between the two writes of step 3 (its train.log line lost), then a kill mid-line at step 5
    (run / "train.log").write_text("\n".join(lines[:2] + lines[3:]) + "\nstep 5/8 loss 4.")
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "loss": 4.')
    capsys.readouterr()
    assert train_main(cfg, f"output_dir={run}", "max_steps=6") == 0
    out = capsys.readouterr().out
    assert f"{run / 'metrics.jsonl'} line 5 was cut short" in out and f"{run / 'train.log'} line 4 was cut short" in out
    assert "disagreed with" in out and "step(s) 3" in out
    steps = [r["step"] for r in read_metrics(str(run / "metrics.jsonl"))]
    assert steps == [1, 2, 3, 4, 5, 6] == log_steps(run)
    rows = {r["step"]: r for r in read_metrics(str(run / "metrics.jsonl"))}
    # the lost line written again as its invocation printed it (max_steps 4, from segments.jsonl)
    assert (run / "train.log").read_text().splitlines()[2] == step_line(rows[3], 4)


def edit_lines(path, edit) -> None:
    """Rewrite the text file ``path`` as ``edit(its lines)``, one newline after each."""
    path.write_text("\n".join(edit(path.read_text().splitlines())) + "\n")


def damage(run, case: str) -> tuple[str, str]:
    """Damage one record file of ``run``; returns (file, what the error must say)."""
    metrics, log = run / "metrics.jsonl", run / "train.log"
    if case == "metrics bad first line":
        metrics.write_text("not json\n" + metrics.read_text())
        return "metrics.jsonl", "line 1 is damaged"
    if case == "metrics middle line":
        edit_lines(metrics, lambda rows: rows[:2] + [rows[2][:20]] + rows[3:])
        return "metrics.jsonl", "line 3 is damaged"
    if case == "metrics repeated step":
        edit_lines(metrics, lambda rows: rows[:2] + rows[1:])
        return "metrics.jsonl", "line 3 is step 2 after step 2"
    if case == "metrics row without a step":
        edit_lines(metrics, lambda rows: rows[:1] + ['{"loss": 1.0}'] + rows[1:])
        return "metrics.jsonl", "line 2 is damaged"
    if case == "train.log non-UTF-8":
        lines = log.read_bytes().split(b"\n")
        log.write_bytes(b"\n".join(lines[:1] + [b"step 2/4 \xff\xfe loss"] + lines[2:]))
        return "train.log", "line 2 is not UTF-8 text (byte 0xff)"
    if case == "train.log foreign line":
        edit_lines(log, lambda lines: lines[:1] + ["hello"] + lines[1:])
        return "train.log", "line 2 is damaged"
    if case == "segments damaged middle":
        seg = run / "segments.jsonl"
        seg.write_text("{oops\n" + seg.read_text())
        return "segments.jsonl", "line 1 is damaged"
    if case == "config.yaml non-UTF-8":
        (run / "config.yaml").write_bytes(b"\xff" + (run / "config.yaml").read_bytes())
        return "config.yaml", "line 1 is not UTF-8 text"
    if case == "config.yaml not YAML":
        (run / "config.yaml").write_text("lr: [1\nseed: 0\n")
        return "config.yaml", "is not valid YAML (line"
    if case == "run_summary.txt a directory":
        (run / "run_summary.txt").unlink()
        (run / "run_summary.txt").mkdir()
        return "run_summary.txt", "is a directory"
    if case == "final a file":
        shutil.rmtree(run / "final")
        (run / "final").write_text("x")
        return "final", "not a directory"
    if case == "a file where a checkpoint goes":
        (run / "checkpoint-6").write_text("x")
        return "checkpoint-6", "not a directory"
    if case == "train.log a FIFO":
        log.unlink()
        os.mkfifo(log)
        return "train.log", "is not a regular file"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["metrics bad first line", "metrics middle line", "metrics repeated step",
                                  "metrics row without a step", "train.log non-UTF-8", "train.log foreign line",
                                  "segments damaged middle", "config.yaml non-UTF-8", "config.yaml not YAML", "run_summary.txt a directory",
                                  "final a file", "a file where a checkpoint goes", "train.log a FIFO"])
def test_a_damaged_record_is_one_line_naming_file_and_line_and_changes_nothing(finished, tmp_path, capsys, case):
    cfg, run = copy_run(finished, tmp_path)
    name, message = damage(run, case)
    before = record_bytes(run)
    capsys.readouterr()
    assert train_main(cfg, f"output_dir={run}", "max_steps=6") == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(run / name) in line and message in line, line
    assert record_bytes(run) == before and not (run / "run.lock").exists()


def test_the_reader_tells_a_torn_tail_from_damage(tmp_path):
    path = tmp_path / "log"

    def read(data: bytes, keep=False):
        path.write_bytes(data)
        return read_log(str(path), lambda t: json.loads(t)["step"], "a test log", keep_unterminated=keep)

    assert read(b"").items == [] and read(b"\n\n").items == []
    assert read(b'{"step": 1}\n{"step": 2}').torn == 2  # an unterminated line: a kill may have cut it
    kept = read(b'{"step": 1}\n{"step": 2}', keep=True)
    assert kept.items == [1, 2] and kept.torn is None  # a JSON object that parses closed itself
    assert read('{"step": 1}\n{"text": "\u00e9'.encode()[:-1]).torn == 2  # a cut inside a UTF-8 character
    with pytest.raises(ConfigError, match="line 2 is not UTF-8"):
        read(b'{"step": 1}\n\xff{"step": 2}')  # a stray byte is not a cut
    with pytest.raises(ConfigError, match="line 1 is damaged"):
        read(b'{"step": 1\n{"step": 2}\n')
    with pytest.raises(ConfigError, match="is a directory"):
        read_log(str(tmp_path), json.loads, "a test log")
    assert read_log(str(tmp_path / "absent"), json.loads, "a test log").items == []


def test_train_log_without_metrics_is_only_cut_back(tmp_path):
    """Without metrics.jsonl there is nothing to agree with: train.log's lines up to the step stay."""
    lines = [step_line({"step": s, "loss": 1.0}, 9) for s in range(1, 10)]
    (tmp_path / "train.log").write_text("\n".join(lines) + "\n")
    RunLog(str(tmp_path), enabled=True, resume_step=5)
    assert (tmp_path / "train.log").read_text().splitlines() == lines[:5]
    assert not os.path.exists(tmp_path / "metrics.jsonl")
