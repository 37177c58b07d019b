"""DeepSpeed ZeRO-2 / ZeRO-3 smoke tests on the CPU (DeepSpeed selects its CPU accelerator here).

accelerate forms a multi-process DeepSpeed group only on GPUs, so on the CPU these run one
process; the multi-GPU launch uses the same shipped JSON configs.
"""

import os
import subprocess
import sys

import pytest

from rpt.metrics import read_metrics
from rpt.model import RPTForCausalLM
from tests.train_helpers import ROOT, env, train_cmd, write_config

pytest.importorskip("deepspeed")


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_zero_trains_and_saves_on_cpu(tmp_path, stage):
    launch_cfg = tmp_path / "accelerate.yaml"
    launch_cfg.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"
        f"deepspeed_config:\n  deepspeed_config_file: {ROOT}/configs/accelerate/ds_zero{stage}.json\n"
        f"  zero3_init_flag: {'true' if stage == 3 else 'false'}\n"
        "num_processes: 1\nnum_machines: 1\nmachine_rank: 0\nrdzv_backend: static\nsame_network: true\n"
    )
    cfg = write_config(tmp_path, max_steps=3, save_every=2, eval_batches=1, eval_every=3, precision="bf16")
    accelerate = os.path.join(os.path.dirname(sys.executable), "accelerate")
    cmd = [accelerate, "launch", "--config_file", str(launch_cfg), "--main_process_port", str(29540 + stage)]
    cmd += train_cmd(cfg)[1:]
    res = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    run = tmp_path / "run"
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert (run / "checkpoint-2" / "latest").exists()  # a DeepSpeed checkpoint
    model = RPTForCausalLM.from_pretrained(run / "final")
    assert model.offset_embedding.weight.abs().sum() > 0  # the table was trained and gathered
