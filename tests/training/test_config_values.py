"""Config values are finite numbers of the right type (named when not), a base chain has no cycle,
and a training loss that turns NaN/inf stops the run on every rank with one line naming the step."""

import os

import pytest

from rpt.training.config import ConfigError, load_config
from rpt.training.measure.metrics import read_metrics
from tests.helpers.inprocess_train import one_error_line, train_main
from tests.helpers.train_helpers import ROOT, accelerate_cmd, free_port, run_cmd, write_config


@pytest.mark.parametrize("override, key", [
    ("lr=nan", "'lr'"), ("lr=.inf", "'lr'"), ("lr=inf", "'lr'"), ("lr=-.inf", "'lr'"), ("weight_decay=nan", "'weight_decay'"),
    ("max_grad_norm=nan", "'max_grad_norm'"), ("s=.nan", "'s'"), ("q=inf", "'q'"), ("min_lr_ratio=nan", "'min_lr_ratio'"),
    ("adam_beta1=nan", "'adam_beta1'"), ("adam_beta2=1.0", "'adam_beta2'"), ("peak_tflops=inf", "'peak_tflops'"),
    ("val_fraction=nan", "'val_fraction'"), ("lr=", "'lr'"), ("window=null", "'window'"), ("window=", "'window'"),
    ("seq_len=null", "'seq_len'"), ("window=1e12", "'window'"), ("max_steps=1e400", "'max_steps'"),
    ("model.hidden_size='64'", "'model.hidden_size'"), ("model.rms_norm_eps=.nan", "'model.rms_norm_eps'"),
    ("model.tie_word_embeddings=1", "'model.tie_word_embeddings'"), ("model.hidden_size=-4", "'model.hidden_size'"),
    ("model.num_hidden_layers=0", "'model.num_hidden_layers'"), ("lora={alpha: .nan}", "'lora'"),
])
def test_non_finite_or_mistyped_values_are_refused_by_key(tmp_path, override, key):
    cfg = write_config(tmp_path)
    with pytest.raises(ConfigError) as e:
        load_config(cfg, [override])
    assert key in str(e.value)


def test_finite_values_still_load(tmp_path):
    cfg = load_config(write_config(tmp_path), ["lr=1e-3", "max_grad_norm=0", "model.hidden_size=64", "model.rms_norm_eps=1e-5"])
    assert cfg.lr == 1e-3 and cfg.model["hidden_size"] == 64


def test_a_config_that_is_its_own_base_is_one_error(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\nlr: 0.1\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="its own base"):
        load_config(str(tmp_path / "a.yaml"))
    (tmp_path / "c.yaml").write_text("base: c.yaml\n")
    with pytest.raises(ConfigError, match="its own base"):
        load_config(str(tmp_path / "c.yaml"))


DIVERGES = dict(max_steps=6, save_every=1, keep_last=10, eval_batches=0, warmup_steps=0, max_grad_norm=0.0, lr=1e30)


def test_a_nan_loss_stops_the_run_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path, capsys):
    cfg = write_config(tmp_path, **DIVERGES)
    assert train_main(cfg) == 2
    line = one_error_line(capsys.readouterr().err)
    run = tmp_path / "run"
    logged = [r["step"] for r in read_metrics(run / "metrics.jsonl")]
    bad_step = logged[-1] + 1  # log_every 1: every finite step was logged, the NaN one was not
    assert f"became NaN or inf at step {bad_step}" in line and f"checkpoint-{bad_step - 1}" in line
    assert sorted(os.listdir(run)) == sorted([f"checkpoint-{s}" for s in logged] + ["config.yaml", "metrics.jsonl",
                                                                                      "segments.jsonl", "train.log",
                                                                                      "run_summary.txt"])
    assert not (run / "final").exists()



def test_the_nan_check_reads_the_host_only_where_a_step_is_kept_and_still_names_the_first_bad_step(tmp_path, capsys,
                                                                                                     monkeypatch):
    """Between log, evaluation and save steps the check stays on the device (no host sync per step);
    the step it names is still the first whose loss was not finite (the every-step run's)."""
    from rpt.training import loop as training

    cfg = write_config(tmp_path, **DIVERGES)
    assert train_main(cfg) == 2
    bad_step = [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")][-1] + 1
    capsys.readouterr()
    reads = []
    real = training.stop_if_not_finite
    monkeypatch.setattr(training, "stop_if_not_finite", lambda *a, **k: (reads.append(1), real(*a, **k)))
    sparse = {"log_every": 4, "save_every": 4}
    assert train_main(cfg, f"output_dir={tmp_path / 'sparse'}", *(f"{k}={v}" for k, v in sparse.items())) == 2
    assert f"became NaN or inf at step {bad_step};" in one_error_line(capsys.readouterr().err)
    checks = [s for s in range(1, DIVERGES["max_steps"] + 1) if s % 4 == 0 or s == DIVERGES["max_steps"]]
    assert len(reads) == len([s for s in checks if s < bad_step]) + 1  # up to the first check at or after it
    assert not any(int(n.split("-")[1]) >= bad_step for n in os.listdir(tmp_path / "sparse") if n.startswith("checkpoint-"))


@pytest.mark.slow
def test_a_nan_loss_stops_both_ddp_ranks_together(tmp_path):
    cfg = write_config(tmp_path, **DIVERGES)
    res = run_cmd(accelerate_cmd(os.path.join(ROOT, "configs/accelerate/cpu_ddp.yaml"), free_port(), cfg), timeout=300)
    assert res.returncode != 0
    assert res.stderr.count("error: the training loss became NaN or inf at step") == 2  # each rank, no hang
    assert not (tmp_path / "run" / "final").exists()
