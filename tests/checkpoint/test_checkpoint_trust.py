"""Reading a checkpoint back never runs code and trusts no changed file: the scheduler is JSON,
every file is hashed in manifest.json and verified before anything reads it, a pre-manifest
checkpoint has each pickle read as plain data first (weights_only), and each refusal is one line
naming the file."""

import os
import pickle
import shutil

import pytest
import torch

from rpt.checkpoint.directories import (
    MANIFEST,
    CheckpointError,
    load_data_state,
    read_trainer_state,
    verify_manifest,
    write_manifest,
)
from rpt.training.measure.metrics import read_metrics
from tests.helpers.inprocess_train import one_error_line, train_main
from tests.helpers.train_helpers import accelerate_cmd, free_port, run_cmd, write_config, zero_launch_config

FAST = dict(max_steps=4, save_every=2, keep_last=5, eval_batches=0)


class WritesAFile:
    """Unpickled without restriction, this writes ``path``: the proof that code ran."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (exec, (f"open({self.path!r}, 'w').write('code ran')",))


def plant(path, marker) -> None:
    with open(path, "wb") as f:
        pickle.dump(WritesAFile(marker), f)


def as_written_before_manifests(checkpoint) -> None:
    """Turn a checkpoint into what rpt wrote before manifests: the scheduler in accelerate's pickle."""
    import json

    state = json.loads((checkpoint / "scheduler.json").read_text())
    state["lr_lambdas"] = [None]
    torch.save(state, checkpoint / "custom_checkpoint_0.pkl")
    os.remove(checkpoint / "scheduler.json")
    os.remove(checkpoint / MANIFEST)


@pytest.fixture(scope="module")
def run4(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trust")
    cfg = write_config(tmp, **FAST)
    assert train_main(cfg) == 0
    return cfg, tmp / "run"


def cut_at(run, tmp_path, step: int = 2):
    """A copy of ``run`` interrupted right after checkpoint-``step``."""
    cut = tmp_path / "cut"
    os.makedirs(cut)
    shutil.copytree(run / f"checkpoint-{step}", cut / f"checkpoint-{step}")
    return cut


def test_checkpoint_holds_json_scheduler_and_a_manifest_of_every_file(run4):
    _, run = run4
    ckpt = run / "checkpoint-4"
    assert (ckpt / "scheduler.json").exists() and not (ckpt / "custom_checkpoint_0.pkl").exists()
    assert verify_manifest(str(ckpt)) is True


@pytest.mark.parametrize("name", ["custom_checkpoint_0.pkl", "optimizer.bin", "random_states_0.pkl", "model.safetensors",
                                  "trainer_state.json"])
def test_a_planted_or_replaced_file_is_refused_by_name_and_runs_nothing(run4, tmp_path, capsys, name):
    cfg, run = run4
    cut = cut_at(run, tmp_path)
    marker = tmp_path / "marker"
    plant(cut / "checkpoint-2" / name, marker)
    capsys.readouterr()
    assert train_main(cfg, f"output_dir={cut}") == 2
    line = one_error_line(capsys.readouterr().err)
    assert name in line and MANIFEST in line
    assert not marker.exists()
    assert not (cut / "final").exists()


def test_a_checkpoint_from_before_manifests_resumes_exactly(run4, tmp_path, capsys):
    cfg, run = run4
    cut = cut_at(run, tmp_path)
    as_written_before_manifests(cut / "checkpoint-2")
    capsys.readouterr()
    assert train_main(cfg, f"output_dir={cut}") == 0
    assert "not verified" in capsys.readouterr().out
    a = {r["step"]: r["loss"] for r in read_metrics(run / "metrics.jsonl")}
    b = {r["step"]: r["loss"] for r in read_metrics(cut / "metrics.jsonl")}
    assert sorted(b) == [3, 4] and all(b[s] == pytest.approx(a[s], rel=1e-6) for s in (3, 4))


@pytest.mark.parametrize("name", ["custom_checkpoint_0.pkl", "optimizer.bin", "random_states_0.pkl"])
def test_a_hostile_pickle_in_a_checkpoint_from_before_manifests_is_refused_by_name(run4, tmp_path, capsys, name):
    cfg, run = run4
    cut = cut_at(run, tmp_path)
    as_written_before_manifests(cut / "checkpoint-2")
    marker = tmp_path / "marker"
    plant(cut / "checkpoint-2" / name, marker)
    capsys.readouterr()
    assert train_main(cfg, f"output_dir={cut}") == 2
    line = one_error_line(capsys.readouterr().err)
    assert name in line and "not plain tensor data" in line
    assert not marker.exists()


@pytest.mark.parametrize("content, key", [('{"data_position": 0, "config": {}}', "'step'"), ("{not json", "not valid JSON"),
                                          ('{"step": "two", "data_position": 0, "config": {}}', "'step'"),
                                          ('{"step": 2, "data_position": 0}', "'config'"), ("[1, 2]", "JSON object")])
def test_trainer_state_is_read_with_named_errors(tmp_path, content, key):
    (tmp_path / "trainer_state.json").write_text(content)
    with pytest.raises(CheckpointError, match="trainer_state.json") as e:
        read_trainer_state(str(tmp_path))
    assert key in str(e.value)


def test_data_state_pickle_is_refused_and_a_foreign_one_named(tmp_path):
    directory = tmp_path / "data_state"
    directory.mkdir()
    marker = tmp_path / "marker"
    plant(directory / "rank-0.pt", marker)
    with pytest.raises(CheckpointError, match=r"rank-0\.pt is not plain tensor data"):
        load_data_state(str(tmp_path), 0, 1)
    assert not marker.exists()
    torch.save([1, 2], directory / "rank-0.pt")
    with pytest.raises(CheckpointError, match=r"rank-0\.pt holds a list"):
        load_data_state(str(tmp_path), 0, 1)
    (directory / "rank-0.pt").write_bytes(b"\x00truncated")
    with pytest.raises(CheckpointError, match=r"rank-0\.pt (cannot be read|is not plain tensor data)"):
        load_data_state(str(tmp_path), 0, 1)


def test_manifest_names_an_added_a_missing_and_a_changed_file(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"a")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.json").write_text("{}")
    write_manifest(str(tmp_path))
    assert verify_manifest(str(tmp_path))
    (tmp_path / "sub" / "b.json").write_text("{ }")
    with pytest.raises(CheckpointError, match=r"sub/b\.json changed"):
        verify_manifest(str(tmp_path))
    (tmp_path / "sub" / "b.json").write_text("{}")
    (tmp_path / "c.pkl").write_bytes(b"c")
    with pytest.raises(CheckpointError, match=r"c\.pkl was added"):
        verify_manifest(str(tmp_path))
    os.remove(tmp_path / "c.pkl")
    os.remove(tmp_path / "a.bin")
    with pytest.raises(CheckpointError, match=r"a\.bin is missing"):
        verify_manifest(str(tmp_path))


@pytest.mark.slow
def test_deepspeed_resume_verifies_the_manifest_before_its_engine_unpickles(tmp_path):
    """DeepSpeed's engine loads its files with weights_only=False: a replaced one must never reach it."""
    pytest.importorskip("deepspeed")
    cfg = write_config(tmp_path, max_steps=2, save_every=2, eval_batches=0)
    launch = zero_launch_config(tmp_path, 2)
    res = run_cmd(accelerate_cmd(launch, free_port(), cfg))
    assert res.returncode == 0, res.stderr[-3000:]
    ckpt = tmp_path / "run" / "checkpoint-2"
    assert (ckpt / "manifest.json").exists()
    states = [p for p in ckpt.rglob("*.pt")]
    assert states, list(ckpt.rglob("*"))
    marker = tmp_path / "marker"
    plant(states[0], marker)
    res = run_cmd(accelerate_cmd(launch, free_port(), cfg, "max_steps=4"))
    assert res.returncode != 0 and not marker.exists()
    assert "changed after the checkpoint was written" in res.stderr and states[0].name in res.stderr
    # one error line from train.py (accelerate's launcher adds its own CalledProcessError traceback)
    assert len([x for x in res.stderr.splitlines() if x.startswith("error: ")]) == 1
    assert "rpt/" not in "".join(x for x in res.stderr.splitlines() if x.strip().startswith("File "))
    os.remove(ckpt / MANIFEST)  # a checkpoint without a manifest is not handed to DeepSpeed at all
    res = run_cmd(accelerate_cmd(launch, free_port(), cfg, "max_steps=4"))
    assert res.returncode != 0 and not marker.exists() and "no manifest.json" in res.stderr


@pytest.mark.parametrize("state", [{"base_lrs": ["x", 1.0], "last_epoch": 1, "_step_count": 2},
                                   {"base_lrs": [1.0], "last_epoch": 1, "_step_count": 2},
                                   {"base_lrs": [1.0, float("nan")], "last_epoch": 1, "_step_count": 2},
                                   {"base_lrs": [1.0, 1.0], "last_epoch": "1", "_step_count": 2}, [1, 2]])
def test_a_scheduler_state_that_does_not_fit_the_run_is_named(tmp_path, state):
    import json

    from rpt.checkpoint.directories import load_scheduler_state

    params = [torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))]
    opt = torch.optim.AdamW([{"params": params[:1]}, {"params": params[1:]}], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    (tmp_path / "scheduler.json").write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match=r"scheduler\.json does not hold this run's scheduler state"):
        load_scheduler_state(str(tmp_path), scheduler)


def test_a_damaged_weights_file_in_a_checkpoint_from_before_manifests_is_one_line(run4, tmp_path, capsys):
    cfg, run = run4
    cut = cut_at(run, tmp_path)
    as_written_before_manifests(cut / "checkpoint-2")
    weights = cut / "checkpoint-2" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    capsys.readouterr()
    assert train_main(cfg, f"output_dir={cut}") == 2
    assert "checkpoint-2: its model or optimizer state cannot be loaded" in one_error_line(capsys.readouterr().err)


@pytest.mark.slow
def test_two_processes_refuse_a_changed_checkpoint_together(tmp_path):
    """The main process verifies the manifest and broadcasts its verdict: both ranks stop, none hangs."""
    from tests.helpers.train_helpers import ROOT

    cfg = write_config(tmp_path, max_steps=2, save_every=2, eval_batches=0, micro_batch_size=2)
    launch = os.path.join(ROOT, "configs/accelerate/cpu_ddp.yaml")
    assert run_cmd(accelerate_cmd(launch, free_port(), cfg)).returncode == 0
    marker = tmp_path / "marker"
    plant(tmp_path / "run" / "checkpoint-2" / "optimizer.bin", marker)
    res = run_cmd(accelerate_cmd(launch, free_port(), cfg, "max_steps=4"), timeout=300)
    assert res.returncode != 0 and not marker.exists()
    assert res.stderr.count("optimizer.bin changed after the checkpoint was written") == 2, res.stderr[-3000:]


@pytest.mark.parametrize("kind", ["rpt", "plain"])
def test_a_hostile_pytorch_model_bin_is_one_line_naming_it_and_runs_nothing(tmp_path, capsys, kind):
    """transformers reads .bin weights weights-only and refuses this one; the refusal is one line naming
    the file (not a 10-line UnpicklingError) at every entry point that loads a model directory: an RPT
    checkpoint, and a plain causal LM (``sample.py --rpt-iters 0``, which loaded it with
    ``AutoModelForCausalLM`` directly: a traceback)."""
    from rpt.model import RPTForCausalLM
    from tests.helpers.scripts import load_script
    from tests.helpers.tiny_models import save_tiny_checkpoint

    ckpt = tmp_path / "ckpt"
    save_tiny_checkpoint(ckpt, window=3)
    for name in os.listdir(ckpt):
        if name.endswith(".safetensors"):
            os.remove(ckpt / name)
    if kind == "plain":  # no RPT record: a plain Hugging Face model directory
        os.remove(ckpt / "rpt_config.json")
        shutil.rmtree(ckpt / "rpt_table", ignore_errors=True)
    marker = tmp_path / "marker"
    plant(ckpt / "pytorch_model.bin", marker)
    if kind == "rpt":
        with pytest.raises(CheckpointError, match=r"pytorch_model.bin is not plain tensor data"):
            RPTForCausalLM.from_pretrained(ckpt)
    capsys.readouterr()
    argv = ["--checkpoint", str(ckpt), "--prompt", "x", "--max-new-tokens", "1", "--rpt-iters", "0"]
    assert load_script("sample.py").main(argv[: 6 if kind == "rpt" else 8]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(ckpt / "pytorch_model.bin") in line and "is not plain tensor data" in line
    assert not marker.exists()
