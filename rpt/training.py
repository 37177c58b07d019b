"""The training loop on ``accelerate``: one CPU, one GPU, DDP, or DeepSpeed ZeRO-2/3.

Each optimiser step consumes one *global batch* of ``micro_batch_size x grad_accum x world``
packed chunks. Sample ``i`` of the run is a pure function of the seed (:class:`PackedData`),
and the permutation of micro-batch ``j`` of step ``t`` comes from a generator seeded with
``(seed, t, j)``: a run resumed from ``checkpoint-<t>`` therefore sees exactly the data and
permutations the uninterrupted run saw, and a 2-process run sees the same global batch as a
1-process run with twice the accumulation.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import torch
import yaml
from tqdm.auto import tqdm

from rpt.checkpointing import (
    clear_dir,
    commit_dir,
    latest_checkpoint,
    prune_checkpoints,
    read_trainer_state,
    temp_dir_for,
    write_json_atomic,
)
from rpt.config import TrainConfig
from rpt.data import build_packed, load_or_train_tokenizer
from rpt.metrics import MetricsLog
from rpt.model import RPT_CONFIG_NAME, RPTForCausalLM
from rpt.objective import RPTBatch, make_rpt_batch, ntp_batch
from rpt.plotting import plot_loss_curves

PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}


# ---- pieces ------------------------------------------------------------------------------------
def build_model(cfg: TrainConfig, tokenizer) -> RPTForCausalLM:
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_kwargs: dict[str, Any] = {}
    if cfg.attn_implementation:
        hf_kwargs["attn_implementation"] = cfg.attn_implementation
    source = cfg.init_from or cfg.model
    if isinstance(source, dict):
        spec = dict(source)
        model_type = spec.pop("model_type")
        spec.setdefault("vocab_size", len(tokenizer))
        for name in ("eos_token_id", "bos_token_id", "pad_token_id"):
            spec.setdefault(name, getattr(tokenizer, name, None))
        config = AutoConfig.for_model(model_type, **spec)
        base = AutoModelForCausalLM.from_config(config, **hf_kwargs)
        model = RPTForCausalLM.from_base(base, cfg.window)
    elif os.path.isfile(os.path.join(str(source), RPT_CONFIG_NAME)):
        model = RPTForCausalLM.from_pretrained(source, window=cfg.window, **hf_kwargs)
        if model.window != cfg.window:
            raise ValueError(
                f"init_from {source} was trained with window {model.window} but the config asks for window "
                f"{cfg.window}; set window={model.window}"
            )
    else:
        model = RPTForCausalLM.from_pretrained(source, window=cfg.window, **hf_kwargs)
    if len(tokenizer) > model.lm.get_input_embeddings().num_embeddings:
        model.lm.resize_token_embeddings(len(tokenizer))
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    # Matrices decay; biases, norms and the offset table (a positional embedding) do not.
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 and "offset_embedding" not in name else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2))


def lr_lambda(cfg: TrainConfig):
    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" else 1 - progress
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * shape

    return factor


def objective_generator(seed: int, step: int, micro_index: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + step) * 10_007 + micro_index)


def make_batch(cfg: TrainConfig, rows: torch.Tensor, step: int, micro_index: int) -> RPTBatch:
    if cfg.objective == "ntp":
        return ntp_batch(rows, num_inputs=cfg.seq_len)
    gen = objective_generator(cfg.seed, step, micro_index)
    return make_rpt_batch(rows, cfg.window, cfg.s, cfg.q, generator=gen, num_inputs=cfg.seq_len)


def forward(model, batch: RPTBatch):
    return model(
        batch.input_ids, position_ids=batch.position_ids, offset_ids=batch.offset_ids,
        labels=batch.labels, kinds=batch.kinds, use_cache=False,
    )


def per_kind_means(sums: torch.Tensor, counts: torch.Tensor, prefix: str = "") -> dict[str, float]:
    out = {}
    for kind, (s, c) in enumerate(zip(sums.tolist(), counts.tolist())):
        name = "ntp_loss" if kind == 0 else f"ptp_loss_{kind}"
        out[prefix + name] = s / c if c > 0 else None
    return out


@torch.no_grad()
def evaluate(model, cfg: TrainConfig, val, accelerator) -> dict[str, float]:
    """Validation NTP loss on unpermuted text, and (objective rpt) PTP-l losses on every
    sequence permuted (s = 1) with fixed generators, so evaluations are comparable."""
    model.eval()
    window = accelerator.unwrap_model(model).window
    sums = torch.zeros(window, dtype=torch.float64, device=accelerator.device)
    counts = torch.zeros_like(sums)
    for b in range(accelerator.process_index, cfg.eval_batches, accelerator.num_processes):
        rows = val.sequential(cfg.micro_batch_size, start=b * cfg.micro_batch_size).to(accelerator.device)
        if rows.shape[0] == 0:
            break
        batches = [ntp_batch(rows, num_inputs=cfg.seq_len)]
        if cfg.objective == "rpt":
            gen = torch.Generator().manual_seed(cfg.seed + 7919 * (b + 1))
            rpt = make_rpt_batch(rows.cpu(), cfg.window, 1.0, cfg.q, generator=gen, num_inputs=cfg.seq_len)
            rpt.kinds = rpt.kinds.masked_fill(rpt.kinds == 0, -1)  # NTP comes from the unpermuted pass
            batches.append(rpt.to(accelerator.device))
        for batch in batches:
            keep = batch.kinds >= 0
            batch.labels = batch.labels.masked_fill(~keep, -100)
            batch.kinds = batch.kinds.clamp(min=0)
            out = forward(model, batch)
            sums += out.kind_loss_sum.double()
            counts += out.kind_count.double()
    sums, counts = accelerator.reduce(sums, "sum"), accelerator.reduce(counts, "sum")
    model.train()
    metrics = per_kind_means(sums, counts, prefix="eval_")
    metrics["eval_loss"] = metrics["eval_ntp_loss"]
    return metrics


def parameter_fingerprint(model: torch.nn.Module) -> list[float]:
    """Two cheap numbers per rank that differ if replicas drifted apart."""
    total, weighted = 0.0, 0.0
    for i, p in enumerate(model.parameters()):
        d = p.detach().double()
        total += float(d.sum())
        weighted += float((d * d).sum()) * (i + 1)
    return [total, weighted]


# ---- the run -----------------------------------------------------------------------------------
def run(cfg: TrainConfig) -> dict[str, Any]:
    """Train per ``cfg``; returns the last logged metrics. Writes ``cfg.output_dir``."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    os.makedirs(cfg.output_dir, exist_ok=True)
    accelerator = Accelerator(
        # Without an accelerator device, accelerate only forms a multi-process (gloo) group when
        # told it runs on the CPU; with cpu=False each torchrun worker would train alone.
        cpu=not torch.accelerator.is_available() and os.environ.get("ACCELERATE_USE_DEEPSPEED", "false") != "true",
        mixed_precision=PRECISION[cfg.precision],
        gradient_accumulation_steps=cfg.grad_accum,
        log_with=None if cfg.report_to == "none" else cfg.report_to,
        project_dir=cfg.output_dir,
    )
    main = accelerator.is_main_process
    set_seed(cfg.seed)

    with accelerator.main_process_first():
        tokenizer = load_or_train_tokenizer(
            cfg.tokenizer, cfg.data, cfg.val_fraction, cfg.seed, cfg.cache_dir,
            fallback=cfg.init_from or (cfg.model if isinstance(cfg.model, str) else None),
        )
        if cfg.val_data is not None:
            train = build_packed(cfg.data, None, tokenizer, cfg.seq_len, cfg.val_fraction, cfg.seed, cfg.cache_dir)
            val = build_packed(cfg.val_data, None, tokenizer, cfg.seq_len, cfg.val_fraction, cfg.seed, cfg.cache_dir)
        else:
            train = build_packed(cfg.data, "train", tokenizer, cfg.seq_len, cfg.val_fraction, cfg.seed, cfg.cache_dir)
            val = build_packed(cfg.data, "validation", tokenizer, cfg.seq_len, cfg.val_fraction, cfg.seed, cfg.cache_dir)

    model = build_model(cfg, tokenizer)
    model.train()
    optimizer = build_optimizer(model, cfg)
    ds_plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if ds_plugin is not None:
        # No prepared DataLoader to infer it from: tell DeepSpeed the micro-batch size.
        ds_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = cfg.micro_batch_size
        ds_plugin.deepspeed_config["gradient_accumulation_steps"] = cfg.grad_accum
        ds_plugin.deepspeed_config["train_batch_size"] = cfg.micro_batch_size * cfg.grad_accum * accelerator.num_processes
    model, optimizer = accelerator.prepare(model, optimizer)
    # Built after prepare (ZeRO-3 regroups the parameters) and left unprepared (accelerate would
    # step it once per process); checkpointed through register_for_checkpointing.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    accelerator.register_for_checkpointing(scheduler)

    world, rank = accelerator.num_processes, accelerator.process_index
    global_batch = cfg.micro_batch_size * cfg.grad_accum * world
    metrics_log = MetricsLog(os.path.join(cfg.output_dir, "metrics.jsonl"))

    start_step = 0
    resume_from = latest_checkpoint(cfg.output_dir) if cfg.resume == "auto" else (None if cfg.resume == "none" else cfg.resume)
    if resume_from:
        accelerator.load_state(resume_from)
        state = read_trainer_state(resume_from)
        start_step = int(state["step"])
        if main:
            metrics_log.truncate_after(start_step)
            print(f"resumed from {resume_from} at step {start_step} (data position {state['data_position']})")
    elif main and os.path.exists(metrics_log.path):
        os.remove(metrics_log.path)

    if cfg.report_to != "none":
        accelerator.init_trackers(cfg.project, config=cfg.to_dict(), init_kwargs={"wandb": {"name": cfg.run_name}} if cfg.report_to == "wandb" else {})

    if main:
        with open(os.path.join(cfg.output_dir, "config.yaml"), "w") as f:
            yaml.safe_dump(cfg.to_dict(), f, sort_keys=False)
    window = accelerator.unwrap_model(model).window
    bar = tqdm(total=cfg.max_steps, initial=start_step, disable=not main, desc="train", dynamic_ncols=True)
    last: dict[str, Any] = {}
    acc_sums = torch.zeros(window, dtype=torch.float64, device=accelerator.device)
    acc_counts, acc_loss, acc_n = torch.zeros_like(acc_sums), torch.zeros((), dtype=torch.float64, device=accelerator.device), 0
    t_last, tokens_since = time.perf_counter(), 0

    for step in range(start_step + 1, cfg.max_steps + 1):
        rows_all = train.batch((step - 1) * global_batch, global_batch)
        grad_norm = None
        for m in range(cfg.grad_accum):
            micro = m * world + rank
            rows = rows_all[micro * cfg.micro_batch_size : (micro + 1) * cfg.micro_batch_size]
            batch = make_batch(cfg, rows, step, micro).to(accelerator.device)
            with accelerator.accumulate(model):
                out = forward(model, batch)
                accelerator.backward(out.loss)
                if accelerator.sync_gradients and cfg.max_grad_norm > 0:
                    grad_norm = accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            acc_loss += out.loss.detach().double()
            acc_sums += out.kind_loss_sum.detach().double()
            acc_counts += out.kind_count.detach().double()
            acc_n += 1
        lr = scheduler.get_last_lr()[0]  # the rate this step used
        scheduler.step()
        tokens_since += global_batch * cfg.seq_len
        bar.update(1)

        if step % cfg.log_every == 0 or step == cfg.max_steps:
            loss = accelerator.reduce(acc_loss, "sum") / (acc_n * world)
            sums, counts = accelerator.reduce(acc_sums, "sum"), accelerator.reduce(acc_counts, "sum")
            now = time.perf_counter()
            row = {"step": step, "loss": float(loss), **per_kind_means(sums, counts)}
            row.update(
                lr=lr,
                grad_norm=float(grad_norm) if grad_norm is not None else None,
                tokens_per_s=tokens_since / (now - t_last),
                data_position=step * global_batch,
            )
            acc_sums.zero_(), acc_counts.zero_(), acc_loss.zero_()
            acc_n, t_last, tokens_since = 0, now, 0
            if cfg.eval_batches > 0 and (step % cfg.eval_every == 0 or step == cfg.max_steps):
                row.update(evaluate(model, cfg, val, accelerator))
            if main:
                metrics_log.write(row)
                bar.set_postfix(loss=f"{row['loss']:.3f}", ntp=f"{row['ntp_loss'] or float('nan'):.3f}")
            if cfg.report_to != "none":
                accelerator.log({k: v for k, v in row.items() if v is not None}, step=step)
            last = row
            t_last = time.perf_counter()  # evaluation time is not training throughput

        if step % cfg.save_every == 0 or step == cfg.max_steps:
            save_checkpoint(accelerator, cfg, step, step * global_batch)
            t_last = time.perf_counter()
    bar.close()

    save_final(accelerator, model, tokenizer, cfg)
    fingerprints = accelerator.gather_for_metrics([parameter_fingerprint(accelerator.unwrap_model(model))], use_gather_object=True)
    if main:
        write_json_atomic(os.path.join(cfg.output_dir, "replicas.json"), {"world_size": world, "parameter_fingerprints": fingerprints})
        if cfg.plot:
            png = plot_loss_curves(metrics_log.path, os.path.join(cfg.output_dir, "loss_curves.png"), title=f"{cfg.objective} w={cfg.window}")
            if png:
                print(f"wrote {png}")
        print(f"wrote {os.path.join(cfg.output_dir, 'final')} and {metrics_log.path}")
    accelerator.end_training()
    return last


def save_checkpoint(accelerator, cfg: TrainConfig, step: int, data_position: int) -> None:
    final_path = os.path.join(cfg.output_dir, f"checkpoint-{step}")
    tmp = temp_dir_for(final_path)
    if accelerator.is_main_process:
        clear_dir(tmp)
    accelerator.wait_for_everyone()
    accelerator.save_state(tmp)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        write_json_atomic(os.path.join(tmp, "trainer_state.json"), {"step": step, "data_position": data_position, "config": cfg.to_dict()})
        commit_dir(tmp, final_path)
        prune_checkpoints(cfg.output_dir, cfg.keep_last)
    accelerator.wait_for_everyone()


def save_final(accelerator, model, tokenizer, cfg: TrainConfig) -> None:
    """``final/``: a loadable RPT checkpoint (HF directory + table + tokenizer + config)."""
    final_path = os.path.join(cfg.output_dir, "final")
    tmp = temp_dir_for(final_path)
    state = accelerator.get_state_dict(model)  # gathers ZeRO-3 shards; every rank must call it
    if accelerator.is_main_process:
        clear_dir(tmp)
        accelerator.unwrap_model(model).save_pretrained(tmp, state_dict=state)
        tokenizer.save_pretrained(tmp)
        with open(os.path.join(tmp, "training_config.yaml"), "w") as f:
            yaml.safe_dump(cfg.to_dict(), f, sort_keys=False)
        commit_dir(tmp, final_path)
    accelerator.wait_for_everyone()


__all__ = ["run", "build_model", "evaluate", "make_batch"]
