"""The repository's scripts (``eval/*.py``, ``benchmarks/*.py``) are not a package: import them by path."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # tests/helpers/ -> the repository


def load_script(relative_path: str):
    """A fresh module object for ``ROOT / relative_path`` (each call executes the file again)."""
    name = "script_" + relative_path.removesuffix(".py").replace("/", "_")
    spec = importlib.util.spec_from_file_location(name, ROOT / relative_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- the README's commands, walked in a scratch copy of the repository ---------------------------
# What shrinks a documented train.py run to seconds: few steps on a slice of the stdlib. A config
# that builds its model and tokenizer (no init_from) also gets a micro model and vocabulary.
SHORT_RUN = ["max_steps=3", "warmup_steps=1", "eval_every=3", "eval_batches=1", "save_every=3", "log_every=1",
             "seq_len=32", "micro_batch_size=2", "global_batch_size=null", "data_workers=0", "plot=false"]
SHORT_DATA = ["data={stdlib: {max_files: 12}}", "val_fraction=0.25"]
MICRO_MODEL = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=1",
               "model.num_attention_heads=2", "model.num_key_value_heads=2", "model.max_position_embeddings=1024",
               "tokenizer={train_bpe: {vocab_size: 4096}}"]  # the demo's context and vocabulary: its prompts fit
# Evaluations on a few problems with short answers.
SHORT_EVAL = ["--limit", "1", "--max-new-tokens", "8"]


def scratch_repo(where: Path) -> Path:
    """``where/repo``: the repository's scripts, configs and package linked in, an empty ``runs/``,
    and ``where/shared`` linked to the data beside the clone (``../shared`` from the repo)."""
    repo = where / "repo"
    repo.mkdir(parents=True, exist_ok=True)
    for name in ("train.py", "sample.py", "merge_lora.py", "prepare_data.py", "configs", "eval", "rpt", "benchmarks"):
        if not (repo / name).exists():
            (repo / name).symlink_to(ROOT / name)
    shared = ROOT.parent / "shared"
    if shared.is_dir() and not (where / "shared").exists():
        (where / "shared").symlink_to(shared)
    return repo


def shortened(tokens: list[str], repo: Path) -> list[str]:
    """A documented command with the overrides that make it a seconds-long version of itself."""
    from rpt.training.config import load_config

    script = next((t for t in tokens if t.endswith(".py")), None)
    if script == "train.py":
        after = tokens[tokens.index("train.py") + 1:]
        config = after[after.index("--config") + 1]
        overrides = [t for t in after if "=" in t and not t.startswith("-")]
        cfg = load_config(str(repo / config), overrides)
        extra = SHORT_RUN + ([] if any(t.startswith("data=") for t in overrides) else SHORT_DATA)
        if cfg.init_from is None:
            extra += MICRO_MODEL
        return [*tokens, *extra]
    if script and script.startswith("eval/"):
        return [*tokens, *SHORT_EVAL]
    if script == "sample.py":
        return [*tokens, "--max-new-tokens", "8"]
    return tokens


def short_demo(repo: Path, env: dict) -> None:
    """What the README's commands read after ``make demo``, in miniature: ``runs/demo/ar_c/final``
    (configs/tiny_pretrain.yaml, NTP) and ``runs/demo/rpt/final`` (configs/tiny_finetune.yaml from it),
    trained as the demo trains them (rpt/demo/training_stages.py), for a few steps of a micro model."""
    import subprocess
    import sys

    for name, config, extra in (("ar_c", "configs/tiny_pretrain.yaml", MICRO_MODEL + SHORT_DATA),
                                ("rpt", "configs/tiny_finetune.yaml", ["init_from=runs/demo/ar_c/final", *SHORT_DATA])):
        cmd = [sys.executable, "train.py", "--config", config, f"output_dir=runs/demo/{name}", *SHORT_RUN, *extra]
        res = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr[-3000:]}"
