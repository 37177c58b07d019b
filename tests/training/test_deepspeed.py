"""DeepSpeed ZeRO-2 / ZeRO-3 smoke tests on the CPU (DeepSpeed selects its CPU accelerator here).

accelerate forms a multi-process DeepSpeed group only on GPUs, so on the CPU these run one
process; the multi-GPU launch uses the same shipped JSON configs. ZeRO-3 runs the paper recipe's
path in miniature (streamed data, evaluation, a checkpoint and a resume) in
tests/end_to_end/test_recipe_miniature.py.
"""

import json

import pytest

from rpt.model import RPTForCausalLM
from rpt.training.measure.metrics import read_metrics
from tests.helpers.train_helpers import accelerate_cmd, free_port, run_cmd, write_config, zero_launch_config

pytest.importorskip("deepspeed")


# Slow (40-75 s on 2 cores, each a DeepSpeed launch): the default suite's DeepSpeed run is ZeRO-3's
# streamed recipe (tests/end_to_end/test_recipe_miniature.py); `make test-slow` runs both ZeRO-2 precisions.
@pytest.mark.slow
@pytest.mark.parametrize("stage, precision, clip", [(2, "bf16", 1.0), (2, "fp32", 0.3)])
def test_deepspeed_zero_trains_and_saves_on_cpu(tmp_path, stage, precision, clip):
    """The shipped JSON says "auto": the run's precision and clipping are what DeepSpeed runs."""
    cfg = write_config(tmp_path, max_steps=3, save_every=2, eval_batches=1, eval_every=3, precision=precision,
                       max_grad_norm=clip)
    res = run_cmd(accelerate_cmd(zero_launch_config(tmp_path, stage), free_port(), cfg))
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"DeepSpeed ZeRO-{stage}: {precision}, gradient clipping {clip}, micro-batch 4, accumulation 1" in res.stdout
    run = tmp_path / "run"
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert (run / "checkpoint-2" / "latest").exists()  # a DeepSpeed checkpoint
    model = RPTForCausalLM.from_pretrained(run / "final")
    assert model.offset_embedding.weight.abs().sum() > 0  # the table was trained and gathered
    replicas = json.loads((run / "replicas.json").read_text())
    assert len(replicas["parameter_fingerprints"]) == 1  # ZeRO-2 keeps whole parameters: fingerprints mean something


def test_deepspeed_json_that_pins_another_setting_is_one_error():
    from rpt.training.config import ConfigError, TrainConfig
    from rpt.training.deepspeed_settings import apply_run_config
    from rpt.training.micro_batch import fixed_split

    cfg = TrainConfig(model="x", data={"stdlib": {}}, precision="fp32", max_grad_norm=0.0, micro_batch_size=2, grad_accum=3)
    shipped = json.loads(open("configs/accelerate/ds_zero3.json").read())
    apply_run_config(shipped, cfg, fixed_split(cfg, 4), world_size=4)
    assert shipped["bf16"]["enabled"] is False and shipped["fp16"]["enabled"] is False
    assert shipped["gradient_clipping"] == 0.0  # max_grad_norm: 0 turns DeepSpeed's clipping off too
    assert (shipped["train_micro_batch_size_per_gpu"], shipped["gradient_accumulation_steps"], shipped["train_batch_size"]) == (2, 3, 24)
    for pinned, key in (({"bf16": {"enabled": True}}, "bf16.enabled"), ({"gradient_clipping": 1.0}, "gradient_clipping"),
                        ({"train_micro_batch_size_per_gpu": 8}, "train_micro_batch_size_per_gpu")):
        with pytest.raises(ConfigError, match=rf"sets {key}=.* but the run's config key"):
            apply_run_config(pinned, cfg, fixed_split(cfg, 4), world_size=4)
    bf16 = TrainConfig(model="x", data={"stdlib": {}}, precision="bf16")
    apply_run_config({"bf16": {"enabled": True}}, bf16, fixed_split(bf16, 1), 1)
