"""The demo's training stages: the corpus and its tokenizer, pretraining AR-C, and the commands of
AR-F and the RPT fine-tune for each training seed, each run read back from its metrics."""

from __future__ import annotations

import sys
from pathlib import Path

from rpt.demo.processes import ROOT, run_command
from rpt.training.config import load_config
from rpt.training.measure.metrics import read_metrics

# Every evaluation of a demo run reads the whole validation split (about 86 batches of 16 x 129
# tokens; the count is capped at what exists): the first 8 batches, the training default, are a
# few files whose losses sit almost 1 nat below the split's and swing by more than the 0.05-nat
# differences the report compares.
WHOLE_VALIDATION = "eval_batches=100000"


def _train_cmd(out: Path, name: str, config: str, steps: int, *overrides: str) -> list[str]:
    return [sys.executable, "train.py", "--config", config, f"output_dir={out / name}", f"max_steps={steps}",
            WHOLE_VALIDATION, *overrides]


def fine_tune_name(arm: str, seed: int, seeds: list[int]) -> str:
    """``ar_f`` / ``rpt`` for the first seed (the run every later stage evaluates), ``<arm>_seed<s>`` after."""
    return arm if seed == seeds[0] else f"{arm}_seed{seed}"


def fine_tune_commands(out: Path, ar_c: str, steps: int, seeds: list[int]) -> dict[str, list[str]]:
    """AR-F and the RPT fine-tune from AR-C, once per training seed (the arms of one seed share its
    data order, so their difference is paired)."""
    common = (f"init_from={ar_c}", "tokenizer=null", f"eval_every={steps}")
    commands = {}
    for seed in seeds:
        commands[fine_tune_name("ar_f", seed, seeds)] = _train_cmd(
            out, fine_tune_name("ar_f", seed, seeds), "configs/tiny_pretrain.yaml", steps, *common, f"seed={seed}",
            "lr=3e-3", "warmup_steps=20")  # = the fine-tune's lr and warm-up
        commands[fine_tune_name("rpt", seed, seeds)] = _train_cmd(
            out, fine_tune_name("rpt", seed, seeds), "configs/tiny_finetune.yaml", steps, *common, f"seed={seed}")
    return commands


def train_stage(out: Path, name: str, config: str, steps: int, *overrides: str, threads: int | None = None) -> dict:
    run_command(_train_cmd(out, name, config, steps, *overrides), threads=threads)
    return train_result(out / name, steps)


def train_result(run_dir: Path, steps: int) -> dict:
    rows = read_metrics(str(run_dir / "metrics.jsonl"))
    evals = [r for r in rows if r.get("eval_ntp_loss") is not None]
    return {
        "final": str(run_dir / "final"),
        "steps": steps,
        "first_eval": evals[0] if evals else None,
        "last_eval": evals[-1] if evals else None,
        # Rows of an evaluation between logged steps carry no throughput.
        "tokens_per_s": (sum(r["tokens_per_s"] for r in logged) / len(logged)) if (logged := [r for r in rows if "tokens_per_s" in r]) else None,
        "loss_curves": str(run_dir / "loss_curves.png"),
    }


def corpus_stage(out: Path) -> dict:
    from rpt.data import (  # late: torch stays out of the demo's parent process
        build_packed,
        load_or_train_tokenizer,
        stdlib_files,
        stdlib_texts,
    )

    cfg = load_config(str(ROOT / "configs/tiny.yaml"))
    tok = load_or_train_tokenizer(cfg.tokenizer, cfg.data, cfg.val_fraction, cfg.seed, cfg.cache_dir, None)
    train, val = build_packed(cfg, "train", tok), build_packed(cfg, "validation", tok)
    return {
        "stdlib_files": len(stdlib_files()), "validation_files": len(stdlib_texts("validation", cfg.val_fraction)),
        "vocab_size": len(tok), "seq_len": cfg.seq_len,
        "train_tokens": len(train) * (cfg.seq_len + 1), "validation_tokens": len(val) * (cfg.seq_len + 1),
    }

