"""The paper recipe's code path in miniature: streamed local JSONL for training and validation,
one evaluation batch (fewer than processes), evaluation every 2 steps, a checkpoint at step 3,
then ``resume=auto`` to step 6 -- with two DDP processes (gloo) and with ZeRO-3 in one process."""

import json
import os

import pytest

from rpt.data import stdlib_texts
from rpt.model import RPTForCausalLM
from rpt.training.measure.metrics import read_metrics
from tests.helpers.train_helpers import (
    ROOT,
    accelerate_cmd,
    free_port,
    run_cmd,
    write_config,
    write_jsonl,
    zero_launch_config,
)


def recipe_config(tmp_path, **overrides) -> str:
    texts = stdlib_texts(None, 0.0, max_files=40)
    train = write_jsonl(tmp_path / "train.jsonl", texts[:34])
    val = write_jsonl(tmp_path / "val.jsonl", texts[34:])
    return write_config(
        tmp_path, data={"path": train, "streaming": True}, val_data={"path": val, "streaming": True},
        eval_batches=1, eval_every=2, save_every=3, max_steps=3, micro_batch_size=2, shuffle_buffer=16, **overrides,
    )


def run_to_3_then_resume_to_6(tmp_path, launch: str, port: int, script: str | None = None, **overrides):
    cfg = recipe_config(tmp_path, **overrides)
    first = run_cmd(accelerate_cmd(launch, port, cfg, script=script))
    assert first.returncode == 0, first.stderr[-3000:]
    assert script is None or "shm_comm" not in first.stdout + first.stderr  # the stand-in took effect
    assert (tmp_path / "run" / "checkpoint-3" / "trainer_state.json").exists()
    second = run_cmd(accelerate_cmd(launch, port, cfg, "max_steps=6", "resume=auto", script=script))
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stdout and "checkpoint-3" in second.stdout
    run = tmp_path / "run"
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    evals = [r for r in rows if r.get("eval_ntp_loss") is not None]
    assert [r["step"] for r in evals] == [2, 3, 4, 6]  # every 2 steps, and at each run's last step
    assert all(r["eval_ptp_loss_1"] is not None for r in evals)
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["peak_mem_mb"] > 0 and "mfu" in r
    assert RPTForCausalLM.from_pretrained(run / "final").window == 3
    return run


# slow (25 s): two processes are in the default suite through test_training.py's DDP equality test, a
# streamed resume through test_training_resume_data.py
@pytest.mark.slow
def test_two_process_ddp_streaming_recipe(tmp_path):
    run = run_to_3_then_resume_to_6(tmp_path, os.path.join(ROOT, "configs/accelerate/cpu_ddp.yaml"), free_port())
    assert sorted(os.listdir(run / "checkpoint-6" / "data_state")) == ["rank-0.pt", "rank-1.pt"]
    fingerprints = json.loads((run / "replicas.json").read_text())["parameter_fingerprints"]
    assert len(fingerprints) == 2 and fingerprints[0] == fingerprints[1]


@pytest.mark.multiprocess
def test_zero3_streaming_recipe(tmp_path):
    pytest.importorskip("deepspeed")
    # one process has no ranks to reduce across: DeepSpeed's shared-memory kernel (80 CPU-s of g++ on a fresh
    # machine) is left unbuilt, as DeepSpeed does where it cannot build it
    run = run_to_3_then_resume_to_6(tmp_path, zero_launch_config(tmp_path, 3), free_port(),
                                    script=os.path.join(ROOT, "tests/helpers/train_without_shm_kernel.py"), precision="bf16")
    replicas = json.loads((run / "replicas.json").read_text())
    assert replicas["parameter_fingerprints"] is None and "ZeRO-3" in replicas["note"]
    assert (run / "checkpoint-6" / "latest").exists()  # a DeepSpeed checkpoint
