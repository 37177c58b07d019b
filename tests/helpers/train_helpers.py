"""A training config small enough for tests: a micro Llama on a slice of the stdlib."""

import os
import socket
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/helpers/ -> the repository

MICRO = {
    "model": {
        "model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
    },
    "tokenizer": {"train_bpe": {"vocab_size": 300}},
    "data": {"stdlib": {"max_files": 25}},
    "val_fraction": 0.2,
    "seq_len": 32,
    "window": 3,
    "s": 0.5,
    "q": 0.2,
    "micro_batch_size": 4,
    "lr": 3e-3,
    "warmup_steps": 2,  # <= every test's max_steps (a larger one is shortened to the run)
    "max_steps": 10,
    "eval_every": 5,
    "eval_batches": 2,
    "log_every": 1,
    "save_every": 5,
    "plot": False,
}


def write_config(tmp_path, **overrides) -> str:
    cfg = dict(MICRO, cache_dir=str(tmp_path / "cache"), output_dir=str(tmp_path / "run"))
    cfg.update(overrides)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def env() -> dict:
    e = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline", TOKENIZERS_PARALLELISM="false", PYTHONPATH=ROOT)
    e["OMP_NUM_THREADS"] = "1"
    e["OMP_WAIT_POLICY"] = "PASSIVE"
    return e


def train_cmd(config: str, *overrides: str) -> list[str]:
    return [sys.executable, os.path.join(ROOT, "train.py"), "--config", config, *overrides]


def run_train(config: str, *overrides: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(train_cmd(config, *overrides), env=env(), capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def free_port() -> int:
    """A TCP port no process listens on now: the rendezvous port of one launch, so that launches in parallel
    test workers (or other test runs on the machine) never meet on a fixed one."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def accelerate_cmd(launch_config: str, port: int, config: str, *overrides: str, script: str | None = None) -> list[str]:
    """``accelerate launch`` of train.py (or of ``script``, a stand-in that runs train.py) on ``config``."""
    accelerate = os.path.join(os.path.dirname(sys.executable), "accelerate")
    run = train_cmd(config, *overrides)[1:]
    if script:
        run[0] = script
    return [accelerate, "launch", "--config_file", launch_config, "--main_process_port", str(port), *run]


def run_cmd(cmd: list[str], timeout: int = 400) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def zero_launch_config(tmp_path, stage: int, num_processes: int = 1) -> str:
    """An accelerate launch file for DeepSpeed ZeRO-``stage`` with the shipped JSON config."""
    path = tmp_path / f"accelerate_zero{stage}.yaml"
    path.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"
        f"deepspeed_config:\n  deepspeed_config_file: {ROOT}/configs/accelerate/ds_zero{stage}.json\n"
        f"  zero3_init_flag: {'true' if stage == 3 else 'false'}\n"
        f"num_processes: {num_processes}\nnum_machines: 1\nmachine_rank: 0\nrdzv_backend: static\nsame_network: true\n"
    )
    return str(path)


def write_jsonl(path, texts) -> str:
    import json

    with open(path, "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    return str(path)
