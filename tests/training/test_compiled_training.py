"""``compile: true`` (rpt/training/compiled_blocks.py): the same training as eager, compiled once, under
gradient checkpointing, DDP and DeepSpeed ZeRO-2 (a slow test), and refused in one line under ZeRO-3."""

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
import torch
from functorch.compile import make_boxed_func
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from rpt.model import RPTForCausalLM
from rpt.training.compiled_blocks import compile_blocks, transformer_blocks
from rpt.training.config import TrainConfig
from rpt.training.measure.metrics import read_metrics
from rpt.training.setup import build_optimizer
from rpt.training.step import forward, make_batch
from tests.helpers.inprocess_train import train_main
from tests.helpers.tiny_models import tiny_gpt2, tiny_llama
from tests.helpers.train_helpers import (
    MICRO,
    ROOT,
    accelerate_cmd,
    env,
    free_port,
    run_cmd,
    train_cmd,
    write_config,
    zero_launch_config,
)


def losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(os.path.join(run_dir, "metrics.jsonl")) if "loss" in r}


def recompiled(stderr: str) -> bool:
    return "Recompiling function" in stderr


@pytest.mark.multiprocess
def test_compiled_blocks_train_like_eager_and_compile_once(tmp_path):
    """20 steps of the tests' tiny config (inductor), for both objectives: every logged loss within 1e-4
    relative of the eager run, no recompilation over the steps and the evaluation at the end."""
    compiled_env = dict(env(), TORCH_LOGS="recompiles")
    configs = {}
    for objective in ("rpt", "ntp"):
        (tmp_path / objective).mkdir()
        configs[objective] = write_config(tmp_path / objective, objective=objective, max_steps=20, eval_every=20,
                                          eval_batches=2, save_every=100)

    def start_compiled(objective):  # a process of its own: dynamo's state and its recompile log are per process
        return subprocess.Popen(
            train_cmd(configs[objective], f"output_dir={tmp_path / objective / 'compiled'}", "compile=true"),
            env=compiled_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)

    def check_compiled(objective, proc):
        stdout, stderr = proc.communicate(timeout=400)
        assert proc.returncode == 0, (objective, stderr[-3000:])
        assert "transformer blocks compiled with inductor" in stdout
        assert not recompiled(stderr), stderr[-3000:]

    rpt = start_compiled("rpt")
    for objective in ("rpt", "ntp"):  # the eager references in this process meanwhile
        assert train_main(configs[objective], f"output_dir={tmp_path / objective / 'eager'}") == 0
    check_compiled("rpt", rpt)
    # NTP's run after RPT's: the blocks' graphs are the same, so inductor's on-disk cache hands them over
    # instead of generating and building their C++ kernels again
    check_compiled("ntp", start_compiled("ntp"))
    for objective in ("rpt", "ntp"):
        eager, compiled = losses(tmp_path / objective / "eager"), losses(tmp_path / objective / "compiled")
        assert sorted(eager) == sorted(compiled) == list(range(1, 21))
        for step in eager:
            assert compiled[step] == pytest.approx(eager[step], rel=1e-4), (objective, step)
        evals = [r for r in read_metrics(tmp_path / objective / "compiled" / "metrics.jsonl") if "eval_ntp_loss" in r]
        assert evals and evals[-1]["step"] == 20


def _grads(model, batch) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    forward(model, batch).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_gradient_checkpointing_with_compile_gives_the_same_gradients():
    cfg = TrainConfig(model="x", data="x", objective="rpt", seq_len=32, window=3, s=1.0, q=0.2)
    batch = make_batch(cfg, torch.randint(0, 97, (4, 33), generator=torch.Generator().manual_seed(0)), 1, 0)
    grads = {}
    for checkpointing in (False, True):
        model = RPTForCausalLM.from_base(tiny_llama(), window=3).train()
        with torch.no_grad():
            model.offset_embedding.weight.normal_(std=0.1)
        if checkpointing:
            model.gradient_checkpointing_enable()
            # aot_eager: the checkpoint's recomputation traced with the block (inductor's code for the
            # same graph is what the 20-step test above runs)
            assert compile_blocks(model, "aot_eager") == 2
        grads[checkpointing] = _grads(model, batch)
    eager, compiled = grads[False], grads[True]
    assert eager.keys() == compiled.keys()
    for name in eager:
        rel = float((compiled[name] - eager[name]).norm() / eager[name].norm().clamp(min=1e-30))
        assert rel <= 1e-6, (name, rel)


class OpsOutsideCompiled(TorchDispatchMode):
    """The operations dispatched outside the compiled blocks (each block's compiled call, forward and
    backward, runs with the mode switched off)."""

    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.__name__] += 1
        return func(*args, **(kwargs or {}))


def test_both_objectives_compiled_steps_share_the_graphs_and_the_ops_outside_them():
    """RPT's compiled step against NTP's, side by side on the CPU: a backend records every graph the
    blocks compile (forward and backward, AOTAutograd) -- NTP's step compiles one of each and RPT's step
    runs them, compiling nothing -- and the operations outside the blocks (embedding, offsets, rotary
    tables, mask decision, tiled loss, their backward, AdamW) are the same, op for op. What is the
    objective's own is the batch's assembly on the host, before the step: RPT's takes more operations."""
    from torch._dynamo.backends.common import aot_autograd

    graphs = []
    current = ["ntp"]

    def recorder(kind):
        def compile_graph(gm, example_inputs):
            graphs.append((current[0], kind, gm.code))

            def run(*args):
                with _disable_current_modes():
                    return gm(*args)
            return make_boxed_func(run)
        return compile_graph

    torch._dynamo.reset()
    model = RPTForCausalLM.from_base(tiny_llama(vocab_size=300), window=3).train()
    assert compile_blocks(model, aot_autograd(fw_compiler=recorder("forward"), bw_compiler=recorder("backward"))) == 2
    for block in transformer_blocks(model):
        compiled_call = block._compiled_call_impl

        def outside_the_mode(*args, _call=compiled_call, **kwargs):
            with _disable_current_modes():
                return _call(*args, **kwargs)
        block._compiled_call_impl = outside_the_mode
    optimizer = build_optimizer(model, TrainConfig(model="x", data="x"))
    rows = torch.randint(0, 300, (4, 33), generator=torch.Generator().manual_seed(0))
    outside, assembly = {}, {}
    for step, objective in enumerate(("ntp", "rpt", "ntp", "rpt"), start=1):
        current[0] = objective
        cfg = TrainConfig(model="x", data="x", objective=objective, seq_len=32, window=3, s=1.0, q=0.2)
        with OpsOutsideCompiled() as built:
            batch = make_batch(cfg, rows, step, 0)
        with OpsOutsideCompiled() as ran:
            forward(model, batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        outside[objective], assembly[objective] = ran.ops, built.ops
    assert [(objective, kind) for objective, kind, _ in graphs] == [("ntp", "forward"), ("ntp", "backward")]
    assert outside["rpt"] == outside["ntp"] and sum(outside["ntp"].values()) > 100
    assert sum(assembly["rpt"].values()) > 2 * sum(assembly["ntp"].values())
    torch._dynamo.reset()


def test_blocks_are_found_in_other_architectures_and_keep_their_names():
    model = RPTForCausalLM.from_base(tiny_gpt2(), window=2)
    keys = list(model.state_dict())
    assert len(transformer_blocks(model)) == 2
    compile_blocks(model, "eager")
    assert list(model.state_dict()) == keys  # checkpoints of a compiled run load into an eager model
    with pytest.raises(ValueError, match="no transformer blocks"):
        compile_blocks(torch.nn.Sequential(torch.nn.Linear(2, 2)))


# slow (10 s, two processes): two-process DDP stays in the default suite through test_training.py's
# test_two_process_ddp_matches_single_process, compiled blocks through test_compiled_blocks_train_like_eager_and_compile_once
@pytest.mark.slow
def test_two_process_ddp_trains_compiled_blocks_in_lockstep(tmp_path):
    """The compiled blocks under DDP's gradient hooks (aot_eager: dynamo + AOTAutograd, no codegen):
    both ranks train, and their replicas are bitwise the same after the steps."""
    cfg = write_config(tmp_path, max_steps=3, save_every=100, eval_batches=2, eval_every=3, micro_batch_size=2,
                       compile=True, compile_backend="aot_eager")
    launch = os.path.join(ROOT, "configs/accelerate/cpu_ddp.yaml")
    ddp = run_cmd(accelerate_cmd(launch, free_port(), cfg))
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "transformer blocks compiled with aot_eager" in ddp.stdout
    assert sorted(losses(tmp_path / "run")) == [1, 2, 3]
    replicas = json.loads((tmp_path / "run" / "replicas.json").read_text())
    assert replicas["world_size"] == 2
    fp = replicas["parameter_fingerprints"]
    assert fp[0] == pytest.approx(fp[1], rel=0, abs=0)


@pytest.mark.slow  # a DeepSpeed engine and a compilation: about 25 s
def test_deepspeed_zero2_trains_compiled(tmp_path):
    pytest.importorskip("deepspeed")
    cfg = write_config(tmp_path, max_steps=2, save_every=100, eval_batches=1, eval_every=2, compile=True,
                       compile_backend="aot_eager")
    zero2 = run_cmd(accelerate_cmd(zero_launch_config(tmp_path, 2), free_port(), cfg))
    assert zero2.returncode == 0, zero2.stderr[-3000:]
    assert "transformer blocks compiled with aot_eager" in zero2.stdout
    assert sorted(losses(tmp_path / "run")) == [1, 2]


def test_zero3_with_compile_is_refused_before_any_work():
    from types import SimpleNamespace

    from rpt.training.config import ConfigError
    from rpt.training.setup import check_backend

    def accelerator(stage):
        plugin = SimpleNamespace(zero_stage=stage) if stage else None
        return SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin))

    cfg = TrainConfig(model="x", data="x", compile=True)
    with pytest.raises(ConfigError, match="ZeRO-3.*use ZeRO-2 or DDP with compile: true, or compile: false"):
        check_backend(accelerator(3), cfg)
    for stage in (0, 2):
        check_backend(accelerator(stage), cfg)
    check_backend(accelerator(3), TrainConfig(model="x", data="x"))


@pytest.mark.slow  # launching DeepSpeed: about 10 s (the refusal itself is tested just above)
def test_deepspeed_zero3_refuses_compile_in_one_line(tmp_path):
    pytest.importorskip("deepspeed")
    cfg = write_config(tmp_path, compile=True)
    zero3 = run_cmd(accelerate_cmd(zero_launch_config(tmp_path, 3), free_port(), cfg))
    assert zero3.returncode != 0
    errors = [line for line in zero3.stderr.splitlines() if line.startswith("error:")]
    assert errors and "ZeRO-3" in errors[0] and "compile" in errors[0], zero3.stderr[-2000:]
    # the training process stops with that line; the only traceback is accelerate launch's own report of the exit
    assert f"{os.sep}rpt{os.sep}" not in zero3.stderr.split(errors[0])[0], zero3.stderr[-3000:]
    assert not (tmp_path / "run" / "checkpoint-1").exists()


def test_compile_backend_is_checked():
    from rpt.training.config import ConfigError, validate

    with pytest.raises(ConfigError, match="compile_backend"):
        validate(TrainConfig(model=MICRO["model"], data={"stdlib": {}}, compile=True, compile_backend="tensorrt"))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_lora_blocks_compile_to_the_same_loss_and_gradients():
    """PEFT's LoRA layers inside a compiled block (aot_eager: dynamo + AOTAutograd): the eager numbers."""
    from rpt.model.lora import add_lora

    cfg = TrainConfig(model="x", data="x", objective="rpt", seq_len=32, window=3, s=1.0, q=0.2)
    batch = make_batch(cfg, torch.randint(0, 97, (4, 33), generator=torch.Generator().manual_seed(1)), 1, 0)
    results = []
    for compiled in (False, True):
        model = RPTForCausalLM.from_base(tiny_llama(), window=3).train()
        add_lora(model, {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]})
        if compiled:
            compile_blocks(model, "aot_eager")
        out = forward(model, batch)
        out.loss.backward()
        results.append((out.loss.item(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (loss, grads), (ref_loss, ref_grads) = results[1], results[0]
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    assert grads.keys() == ref_grads.keys() and any("lora" in n for n in grads)
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-5, atol=1e-7)
