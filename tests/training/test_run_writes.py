"""A run's writes under trouble: a full disk while checkpointing is one line naming the path and the
cause with the previous checkpoint intact; a trainer whose lock another took stops before its next
write; a run.lock that is a symbolic link is named."""

from __future__ import annotations

import errno
import json
import os

import pytest

from rpt.checkpoint.directories import verify_manifest
from rpt.training.config import ConfigError
from rpt.training.measure.metrics import read_metrics
from rpt.training.run_dir import lock as run_lock
from rpt.training.run_dir.lock import LOCK_NAME
from rpt.training.saving import write_failure, written_whole
from tests.helpers.inprocess_train import one_error_line, train_main
from tests.helpers.train_helpers import write_config as _write_config

DISK_FULL = [
    pytest.param(lambda: OSError(errno.ENOSPC, "No space left on device"), id="oserror"),
    pytest.param(lambda: __import__("safetensors").SafetensorError(
        'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'),
        id="safetensors"),
    pytest.param(lambda: RuntimeError("[enforce fail at inline_container.cc:603] . PytorchStreamWriter failed writing "
                                      "file data/0: file write failed"), id="torch"),
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))  # one token store for the module


def write_config(tmp_path, **overrides) -> str:
    """The micro config on a few stdlib files with a tokenizer trained once (seconds saved per module)."""
    from tests.helpers.tiny_models import tiny_tokenizer

    tokenizer = tmp_path.parent / "tokenizer"
    if not tokenizer.exists():
        tiny_tokenizer().save_pretrained(tokenizer)
    return _write_config(tmp_path, tokenizer=str(tokenizer), data={"stdlib": {"max_files": 4}}, **overrides)


@pytest.mark.parametrize("error", DISK_FULL)
def test_disk_full_while_checkpointing_keeps_the_previous_checkpoint(tmp_path, capsys, monkeypatch, error, cache):
    import accelerate

    cfg = write_config(tmp_path, max_steps=2, save_every=1, eval_batches=0, warmup_steps=1, cache_dir=cache)
    real, calls = accelerate.Accelerator.save_state, []

    def save_state(self, path, *a, **k):
        calls.append(path)
        if len(calls) == 2:
            real(self, path, *a, **k)  # a part written, then the disk is full
            raise error()
        return real(self, path, *a, **k)

    monkeypatch.setattr(accelerate.Accelerator, "save_state", save_state)
    assert train_main(cfg) == 2
    line = one_error_line(capsys.readouterr().err)
    run = tmp_path / "run"
    assert f"could not write {run / 'checkpoint-2'} (" in line and f"previous checkpoint {run / 'checkpoint-1'} is intact" in line
    if "torch" not in line:
        assert "No space left on device" in line
    assert verify_manifest(str(run / "checkpoint-1")) and not (run / ".checkpoint-2.tmp").exists()
    assert sorted(p.name for p in run.iterdir() if p.name.startswith((".", "checkpoint"))) == ["checkpoint-1"]


def test_disk_full_while_writing_final(tmp_path, capsys, monkeypatch, cache):
    from rpt.model import wrapper

    cfg = write_config(tmp_path, max_steps=1, save_every=1, eval_batches=0, warmup_steps=1, cache_dir=cache)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(wrapper.RPTForCausalLM, "save_pretrained", full)
    assert train_main(cfg) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"could not write {tmp_path / 'run' / 'final'} (No space left on device)" in line and "checkpoint-1 is intact" in line
    assert not (tmp_path / "run" / ".final.tmp").exists()


def test_only_failed_writes_are_answered():
    assert write_failure(OSError(errno.EDQUOT, "x")) == os.strerror(errno.EDQUOT)
    assert write_failure(ValueError("a shape")) is None and write_failure(RuntimeError("no writing here")) is None
    with pytest.raises(ValueError, match="a shape"):  # anything else goes on as it was
        with written_whole("/nonexistent/.x.tmp", "/nonexistent/x", "/nonexistent", True):
            raise ValueError("a shape")


def test_a_trainer_whose_lock_was_taken_stops_before_its_next_write(tmp_path, capsys, monkeypatch, cache):
    """What `train.py --break-lock` of a second trainer does to the first: its lock replaced by another's."""
    from rpt.training import loop

    cfg = write_config(tmp_path, max_steps=4, save_every=2, eval_batches=0, warmup_steps=1, cache_dir=cache)
    lock = tmp_path / "run" / LOCK_NAME
    real, steps = loop.train_step, []

    def train_step(*a, **k):
        steps.append(1)
        if len(steps) == 3:  # after step 2's metrics and checkpoint: the other trainer breaks the lock
            os.rename(lock, f"{lock}.aside")
            lock.write_text(json.dumps({"host": "node-9", "pid": 77, "token": "theirs", "heartbeat": 1e18}))
            os.unlink(f"{lock}.aside")
        return real(*a, **k)

    monkeypatch.setattr(loop, "train_step", train_step)
    assert train_main(cfg) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{lock} was taken over by host 'node-9' pid 77" in line and "stopped before writing step 3" in line
    run = tmp_path / "run"
    assert [r["step"] for r in read_metrics(str(run / "metrics.jsonl"))] == [1, 2]  # nothing of step 3
    assert sorted(p.name for p in run.iterdir() if p.name.startswith("checkpoint")) == ["checkpoint-2"]
    assert json.loads(lock.read_text())["token"] == "theirs"  # the new holder's lock is left alone


def test_lost_reason_is_one_read_and_names_a_removed_lock(tmp_path):
    run_lock.take_run_lock(str(tmp_path))
    try:
        assert run_lock.lost_reason(str(tmp_path)) is None
        os.unlink(tmp_path / LOCK_NAME)
        assert run_lock.lost_reason(str(tmp_path)) == f"{tmp_path / LOCK_NAME} was removed"
    finally:
        run_lock.release_run_lock(str(tmp_path))
    assert run_lock.lost_reason(str(tmp_path / "never")) is None  # no lock taken: nothing to lose


@pytest.mark.parametrize("target", ["gone/run.lock", "real.lock"])
def test_a_run_lock_that_is_a_symbolic_link_is_named(tmp_path, target):
    (tmp_path / "real.lock").write_text("{}")
    os.symlink(tmp_path / target, tmp_path / LOCK_NAME)
    with pytest.raises(ConfigError) as err:
        run_lock.take_run_lock(str(tmp_path))
    message = str(err.value)
    assert f"{tmp_path / LOCK_NAME} is a symbolic link (to {tmp_path / target}" in message
    assert ("which does not exist" in message) == target.startswith("gone") and "keeps being taken" not in message
    assert os.path.islink(tmp_path / LOCK_NAME)
