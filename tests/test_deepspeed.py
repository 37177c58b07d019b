"""DeepSpeed ZeRO-2 / ZeRO-3 smoke tests on the CPU (DeepSpeed selects its CPU accelerator here).

accelerate forms a multi-process DeepSpeed group only on GPUs, so on the CPU these run one
process; the multi-GPU launch uses the same shipped JSON configs. ZeRO-3 runs the paper recipe's
path in miniature (streamed data, evaluation, a checkpoint and a resume) in
tests/test_recipe_miniature.py.
"""

import json

import pytest

from rpt.metrics import read_metrics
from rpt.model import RPTForCausalLM
from tests.train_helpers import accelerate_cmd, run_cmd, write_config, zero_launch_config

pytest.importorskip("deepspeed")


@pytest.mark.parametrize("stage", [2])
def test_deepspeed_zero_trains_and_saves_on_cpu(tmp_path, stage):
    cfg = write_config(tmp_path, max_steps=3, save_every=2, eval_batches=1, eval_every=3, precision="bf16")
    res = run_cmd(accelerate_cmd(zero_launch_config(tmp_path, stage), 29540 + stage, cfg))
    assert res.returncode == 0, res.stderr[-3000:]
    run = tmp_path / "run"
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert (run / "checkpoint-2" / "latest").exists()  # a DeepSpeed checkpoint
    model = RPTForCausalLM.from_pretrained(run / "final")
    assert model.offset_embedding.weight.abs().sum() > 0  # the table was trained and gathered
    replicas = json.loads((run / "replicas.json").read_text())
    assert len(replicas["parameter_fingerprints"]) == 1  # ZeRO-2 keeps whole parameters: fingerprints mean something
