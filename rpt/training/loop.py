"""The training loop on ``accelerate``: one CPU, one GPU, DDP, or DeepSpeed ZeRO-2/3.

Each optimiser step consumes one *global batch* of ``micro_batch_size x grad_accum x world``
packed chunks (:mod:`rpt.training.micro_batch` splits a ``global_batch_size``). With a token store (every
non-streamed source) sample ``i`` of the run is a pure function of the seed (:mod:`rpt.data.packed`),
and the permutation of sequence ``k`` of the global batch of step ``t`` comes from a generator seeded
with ``(seed, t, k)``: a run resumed from ``checkpoint-<t>`` sees exactly the data and permutations
the uninterrupted run saw, and a 2-process run, or another micro-batch, sees the same global batch
as a 1-process run with twice the accumulation. (Runs started before that keying seeded global
micro-batch ``j`` with ``(seed, t, j)``, and resume so: :data:`LEGACY_DRAWS`.)
Streamed data is split by rank and its position saved per rank (:mod:`rpt.data.streaming`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import pickle
import sys
from typing import Any

import torch
import yaml
from tqdm.auto import tqdm

from rpt.checkpoint.directories import (
    LEGACY_SCHEDULER_STATE,
    CheckpointError,
    check_plain_files,
    clear_dir,
    commit_dir,
    latest_checkpoint,
    load_data_state,
    load_scheduler_state,
    prune_checkpoints,
    save_data_state,
    save_scheduler_state,
    temp_dir_for,
    write_json_atomic,
    write_manifest,
)
from rpt.checkpoint.rpt_config import read_rpt_config
from rpt.data import build_packed, build_tokenizer
from rpt.model import RPTForCausalLM
from rpt.model.lora import add_lora, parameter_line, save_lora_checkpoint
from rpt.model.objective import IGNORE_INDEX, RPTBatch, make_rpt_batch, ntp_batch
from rpt.training.compiled_blocks import compile_blocks, eager_blocks, transformer_blocks
from rpt.training.config import ConfigError, TrainConfig
from rpt.training.deepspeed_settings import apply_run_config, check_deepspeed_batch, engine_precision
from rpt.training.metrics import MetricsLog, Throughput, device_peak_flops, flops_per_token, peak_memory_mb
from rpt.training.micro_batch import Split, check_split
from rpt.training.micro_batch import choose as choose_micro_batch
from rpt.training.plotting import plot_loss_curves
from rpt.training.resume import Start, check_same_data, plan_start
from rpt.training.run_log import RunLog, fit_warmup, step_line, summary_lines
from rpt.training.run_record import append_segment, copy_segments, write_config_record

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
    elif os.path.isdir(str(source)) and read_rpt_config(source) is not None:  # checked: one reader of rpt_config.json
        # LoRA keeps the base as saved (folded, untied): its adapter's table is stored relative to it
        model = RPTForCausalLM.from_pretrained(source, window=cfg.window, retie=cfg.lora is None, **hf_kwargs)
        if model.window != cfg.window:
            raise ValueError(
                f"init_from {source} was trained with window {model.window} but the config asks for window "
                f"{cfg.window}; set window={model.window}"
            )
    else:
        model = RPTForCausalLM.from_pretrained(source, window=cfg.window, **hf_kwargs)
    if len(tokenizer) > model.lm.get_input_embeddings().num_embeddings:
        if cfg.lora is not None:
            # The adapter directory does not hold the base embedding, so new rows would be lost.
            raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the base model's embedding "
                             f"{model.lm.get_input_embeddings().num_embeddings}; LoRA keeps the base frozen: use the "
                             "base model's tokenizer (tokenizer: null) or fine-tune without lora")
        model.lm.resize_token_embeddings(len(tokenizer))
    model.objective = cfg.objective  # recorded in rpt_config.json: RPT decoding needs "rpt"
    if cfg.lora is not None:
        add_lora(model, cfg.lora)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if cfg.compile:  # after checkpointing: each compiled block holds its own recomputation
        compile_blocks(model, cfg.compile_backend)
    model.loss_chunk_bytes = cfg.loss_chunk_mb << 20
    return model


def optimizer_kernel(device: torch.device | str | None) -> dict[str, bool]:
    """AdamW's implementation for parameters on ``device``: torch's fused kernel (the whole update in
    one kernel per dtype and device) where torch has one for that device -- CUDA, and the CPU, where
    it is also 7x faster than foreach -- else the foreach one (a few multi-tensor ops). The same
    update either way."""
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    kind = torch.device(device).type if device is not None else "cpu"
    return {"fused": True} if kind in _get_fused_kernels_supported_devices() else {"foreach": True}


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device | str | None = None) -> torch.optim.Optimizer:
    """AdamW for ``model``, whose parameters train on ``device`` (default: where they are now)."""
    # Matrices decay; biases, norms and the offset table (a positional embedding) do not.
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 and "offset_embedding" not in name else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if device is None:
        device = next(model.parameters()).device
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), **optimizer_kernel(device))


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


# How the objective's draws are keyed, recorded in every checkpoint (trainer_state.json "draws"):
# per sequence of the global batch, so that the micro-batch does not change what is trained; runs
# whose checkpoints do not say (written before) keyed them per global micro-batch and resume so.
DRAWS = "sequence"
LEGACY_DRAWS = "micro_batch"


def objective_generator(seed: int, step: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + step) * 10_007 + index)


def make_batch(cfg: TrainConfig, rows: torch.Tensor, step: int, micro_index: int, draws: str = DRAWS) -> RPTBatch:
    """The objective's batch of global micro-batch ``micro_index`` of ``step``: ``rows`` (``[micro,
    seq_len + 1]``) are sequences ``micro_index * micro`` onwards of the step's global batch."""
    if cfg.objective == "ntp":
        return ntp_batch(rows, num_inputs=cfg.seq_len)
    if draws == LEGACY_DRAWS:
        gen = objective_generator(cfg.seed, step, micro_index)
    else:  # sequence k of the global batch draws from (seed, step, k), whatever the split
        first = micro_index * rows.shape[0]
        gen = [objective_generator(cfg.seed, step, first + r) for r in range(rows.shape[0])]
    return make_rpt_batch(rows, cfg.window, cfg.s, cfg.q, generator=gen, num_inputs=cfg.seq_len)


def forward(model, batch: RPTBatch):
    return model(
        batch.input_ids, position_ids=batch.position_ids, offset_ids=batch.offset_ids,
        labels=batch.labels, kinds=batch.kinds, use_cache=False,
        check_offsets=False,  # rpt.model.objective built them in range; the check would read the device every forward
    )


def per_kind_means(sums: torch.Tensor, counts: torch.Tensor, prefix: str = "") -> dict[str, float]:
    out = {}
    for kind, (s, c) in enumerate(zip(sums.tolist(), counts.tolist())):
        name = "ntp_loss" if kind == 0 else f"ptp_loss_{kind}"
        out[prefix + name] = s / c if c > 0 else None
    return out


class LossMeter:
    """The loss and the per-kind CE sums of the micro-batches since the last reset; summed
    over ranks by :meth:`reduce` (sums and counts add up across micro-batches and ranks)."""

    def __init__(self, window: int, device):
        self.sums = torch.zeros(window, dtype=torch.float64, device=device)
        self.counts = torch.zeros_like(self.sums)
        self.loss = torch.zeros((), dtype=torch.float64, device=device)
        self.first_bad = torch.zeros((), dtype=torch.long, device=device)  # first step with a NaN / inf loss; 0: none
        self.n = 0

    def add(self, out) -> None:
        self.loss += out.loss.detach().double()
        self.sums += out.kind_loss_sum.detach().double()
        self.counts += out.kind_count.detach().double()
        self.n += 1

    def note_step(self, step: int) -> None:
        """Record ``step`` if the loss became NaN or inf in it, on the device: no host read per step
        (the loss is a running sum, so it stays non-finite until :meth:`reset`)."""
        self.first_bad.copy_(torch.where((self.first_bad == 0) & ~torch.isfinite(self.loss), step, self.first_bad))

    def reduce(self, accelerator, prefix: str = "") -> dict[str, float | None]:
        sums, counts = accelerator.reduce(self.sums, "sum"), accelerator.reduce(self.counts, "sum")
        row = per_kind_means(sums, counts, prefix)
        if self.n:
            row[prefix + "loss"] = float(accelerator.reduce(self.loss, "sum")) / (self.n * accelerator.num_processes)
        return row

    def reset(self) -> None:
        self.sums.zero_(), self.counts.zero_(), self.loss.zero_()
        self.n = 0


def train_step(accelerator, model, optimizer, micro_batches, meter: LossMeter, max_grad_norm: float):
    """One optimizer step over ``micro_batches`` (this process's share of the global batch, built on the
    host); returns the gradient norm (a device tensor; None without clipping). Reads nothing back from
    the device: the loss, its split and the NaN flag stay there until a log, evaluation or save."""
    grad_norm = None
    for batch in micro_batches:
        with accelerator.accumulate(model):
            out = forward(model, batch.to(accelerator.device))
            accelerator.backward(out.loss)
            if accelerator.sync_gradients and max_grad_norm > 0:
                grad_norm = accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
            # Called on every micro-batch, but the prepared optimizer (and DeepSpeed) only
            # steps and zeroes when accumulate() syncs gradients, on the last one.
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        meter.add(out)
    return grad_norm


def split_record(split: Split, draws: str) -> dict[str, Any]:
    """What the run record and every checkpoint say of the split run and the keying of the draws."""
    return {"micro_batch_size": split.micro, "grad_accum": split.accum, "micro_batch_choice": split.how, "draws": draws}


def trial_step(model, cfg: TrainConfig, micro: int, device: torch.device, autocast=contextlib.nullcontext) -> None:
    """A forward and backward of ``micro`` random sequences as a training step runs them (the
    micro-batch search's probe, rpt.training.micro_batch), on the bare model (before ``prepare``) on ``device``
    under ``autocast()``: it leaves no gradient and no trace in the random streams, and compiles nothing
    (the blocks run eagerly; a compiled block takes less memory, not more)."""
    model.to(device)
    vocab = model.lm.get_input_embeddings().num_embeddings
    rows = torch.randint(0, vocab, (micro, cfg.seq_len + 1), generator=torch.Generator().manual_seed(0))
    batch = make_batch(cfg, rows, 1, 0).to(device)
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), eager_blocks(), autocast():
            forward(model, batch).loss.backward()
    finally:
        model.zero_grad(set_to_none=True)


def choose_split(cfg: TrainConfig, model, accelerator, deepspeed: bool) -> Split:
    """The run's micro-batch and accumulation (rpt.training.micro_batch), the same on every rank."""
    def reduce_min(micro: int) -> int:
        return -int(accelerator.reduce(torch.tensor(-micro, device=accelerator.device), "max"))

    split = choose_micro_batch(cfg, accelerator.num_processes, model, accelerator.device, deepspeed,
                               lambda micro: trial_step(model, cfg, micro, accelerator.device, accelerator.autocast),
                               reduce_min)
    if cfg.objective == "rpt" and str(cfg.attn_implementation).startswith("flash_attention") and split.micro == 1:
        raise ConfigError("micro_batch_size: auto chose 1, and flash attention with micro_batch_size 1 reads an "
                          "RPT-permuted sequence as packed sequences; use attn_implementation: sdpa or gradient_checkpointing")
    return split


def eval_batches(cfg: TrainConfig, rows: torch.Tensor, index: int) -> list[RPTBatch]:
    """Validation batch ``index``: NTP on unpermuted text and, for objective rpt, PTP-l on every
    sequence permuted (s = 1) with a generator fixed by ``index``, so evaluations compare."""
    batches = [ntp_batch(rows, num_inputs=cfg.seq_len)]
    if cfg.objective == "rpt":
        # Not seeded by cfg.seed: runs with different training seeds are scored on the same PTP
        # targets, so their difference is the training's alone.
        gen = torch.Generator().manual_seed(7919 * (index + 1))
        rpt = make_rpt_batch(rows, cfg.window, 1.0, cfg.q, generator=gen, num_inputs=cfg.seq_len)
        rpt.labels = rpt.labels.masked_fill(rpt.kinds == 0, IGNORE_INDEX)  # NTP comes from the unpermuted pass
        batches.append(rpt)
    return batches


def eval_assignment(n_batches: int, world: int, rank: int) -> list[int | None]:
    """The validation batches of ``rank``: ``b = k * world + rank``, padded with None so that
    every rank runs the same number of forwards -- DDP and ZeRO-3 need every rank in every
    forward, and a rank that skipped one would leave the others waiting forever."""
    per_rank = math.ceil(n_batches / world)
    return [b if b < n_batches else None for b in (k * world + rank for k in range(per_rank))]


@torch.no_grad()
@eager_blocks()  # compiled blocks run eagerly here: no-grad forwards and a short last batch compile nothing
def evaluate(model, cfg: TrainConfig, val, accelerator, micro: int | None = None) -> tuple[dict[str, float], dict[str, Any]]:
    """Validation losses over the first ``eval_batches`` batches of ``cfg.eval_batch_rows()`` validation
    sequences (run in forwards of at most ``micro``), and the per-batch CE sums and target counts by kind
    (``{"batch": [...], "sum": [[...]], "count": [[...]]}``, every rank's batches, in batch order): what
    intervals over validation batches need."""
    model.eval()
    world, rank = accelerator.num_processes, accelerator.process_index
    window = accelerator.unwrap_model(model).window
    meter = LossMeter(window, accelerator.device)
    rows_per_batch = cfg.eval_batch_rows()
    assigned = eval_assignment(min(cfg.eval_batches, math.ceil(len(val) / rows_per_batch)), world, rank)
    # per assigned batch: its index (-1: padding), then CE sums and target counts by kind
    table = torch.zeros(len(assigned), 1 + 2 * window, dtype=torch.float64, device=accelerator.device)
    for i, b in enumerate(assigned):
        rows = val.sequential(rows_per_batch, start=(b or 0) * rows_per_batch)
        before_sums, before_counts = meter.sums.clone(), meter.counts.clone()
        for batch in eval_batches(cfg, rows, b or 0):
            if b is None:  # padding: every label masked, so the forward adds nothing
                batch.labels.fill_(IGNORE_INDEX)
            for part in batch.split(micro or rows_per_batch):
                meter.add(forward(model, part.to(accelerator.device)))
        table[i, 0] = -1 if b is None else b
        table[i, 1: 1 + window] = meter.sums - before_sums
        table[i, 1 + window:] = meter.counts - before_counts
    model.train()
    metrics = meter.reduce(accelerator, prefix="eval_")
    metrics.pop("eval_loss", None)
    metrics["eval_loss"] = metrics["eval_ntp_loss"]
    every = accelerator.gather(table).cpu()  # one collective: [world * per_rank, 1 + 2 * window]
    every = every[every[:, 0] >= 0]
    every = every[every[:, 0].argsort()]
    per_batch = {"batch": every[:, 0].long().tolist(), "sum": every[:, 1: 1 + window].tolist(),
                 "count": every[:, 1 + window:].tolist(), "kinds": ["ntp"] + [f"ptp_{k}" for k in range(1, window)]}
    return metrics, per_batch


def peak_memory_all_ranks(accelerator) -> float:
    """The largest peak memory (MB) of any rank since the previous call (rpt.training.metrics)."""
    mine = torch.tensor(peak_memory_mb(accelerator.device), device=accelerator.device)
    return float(accelerator.reduce(mine, "max"))


def zero_stage(accelerator) -> int:
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return int(plugin.zero_stage) if plugin is not None else 0


def parameter_fingerprint(model: torch.nn.Module) -> list[float]:
    """Two cheap numbers per rank that differ if replicas drifted apart."""
    total, weighted = 0.0, 0.0
    for i, p in enumerate(model.parameters()):
        d = p.detach().double()
        total += float(d.sum())
        weighted += float((d * d).sum()) * (i + 1)
    return [total, weighted]


def replica_report(accelerator, model) -> dict[str, Any]:
    report: dict[str, Any] = {"world_size": accelerator.num_processes}
    if zero_stage(accelerator) == 3:
        # ZeRO-3 partitions every parameter: no rank holds a replica that could drift.
        report.update(parameter_fingerprints=None, note="ZeRO-3: parameters are partitioned, not replicated")
    else:
        fingerprints = [parameter_fingerprint(accelerator.unwrap_model(model))]
        report["parameter_fingerprints"] = accelerator.gather_for_metrics(fingerprints, use_gather_object=True)
    return report


def check_backend(accelerator, cfg: TrainConfig) -> None:
    """Settings the distributed backend cannot run, refused before any data or model is built."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if getattr(plugin, "deepspeed_config", None) is not None:
        check_deepspeed_batch(plugin.deepspeed_config, cfg)
    if zero_stage(accelerator) == 3 and cfg.compile:
        # ZeRO-3 gathers each block's parameters in Python hooks around the block's forward, which
        # a compiled block would have to trace; DeepSpeed compiles those through its own engine.
        raise ConfigError("config key 'compile' = True does not run under DeepSpeed ZeRO-3 (its parameter-gathering "
                          "hooks run inside every compiled block); use ZeRO-2 or DDP with compile: true, or compile: false")


def configure_deepspeed(accelerator, cfg: TrainConfig, model: RPTForCausalLM) -> None:
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if zero_stage(accelerator) == 3:
        import deepspeed

        # The loss reads the output head's weight outside the head's forward (rpt.model.loss): ZeRO-3
        # must gather it for the whole model's forward and backward.
        for p in model.lm.get_output_embeddings().parameters():
            deepspeed.zero.register_external_parameter(model, p)
    if plugin is not None:
        # The run's config decides precision, clipping, micro-batch and accumulation (the
        # shipped JSONs say "auto"); a JSON value that disagrees is one error, not a silent override.
        apply_run_config(plugin.deepspeed_config, cfg, accelerator.num_processes)


def trained_precision(accelerator, model) -> str:
    """The precision the prepared model actually trains in (``run`` refuses one other than the
    config's: config.yaml and the MFU would otherwise report the wrong one)."""
    if getattr(accelerator.state, "deepspeed_plugin", None) is not None:
        return engine_precision(model)
    return {v: k for k, v in PRECISION.items()}[str(accelerator.mixed_precision)]


def make_accelerator(cfg: TrainConfig):
    from accelerate import Accelerator

    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false") != "true":
        import accelerate.utils.other

        # accelerate's unwrap_model imports deepspeed whenever it is installed, only to isinstance-check
        # for a DeepSpeed engine that a run without DeepSpeed never has: the import costs ~0.7 s and
        # prints "Setting accelerator to CPU" on every CPU run.
        accelerate.utils.other.is_deepspeed_available = lambda: False
    return Accelerator(
        # Without an accelerator device, accelerate only forms a multi-process (gloo) group when
        # told it runs on the CPU; with cpu=False each torchrun worker would train alone.
        cpu=not torch.accelerator.is_available() and os.environ.get("ACCELERATE_USE_DEEPSPEED", "false") != "true",
        mixed_precision=PRECISION[cfg.precision],
        gradient_accumulation_steps=1,  # set to the split's once it is chosen (rpt.training.micro_batch)
        log_with=None if cfg.report_to == "none" else cfg.report_to,
        project_dir=cfg.output_dir,
    )


# ---- checkpoints ---------------------------------------------------------------------------------
def load_accelerator_state(accelerator, path: str) -> None:
    """``accelerator.load_state(path)``. A checkpoint written before the scheduler was JSON holds
    its state in ``custom_checkpoint_0.pkl``, which accelerate would unpickle without restriction;
    nothing is registered for it, so accelerate refuses the folder -- after loading everything
    else, as its last check -- and the scheduler is read from it as plain data instead."""
    try:
        accelerator.load_state(path)
    except RuntimeError as e:
        legacy = os.path.exists(os.path.join(path, LEGACY_SCHEDULER_STATE))
        if not (legacy and "Number of custom checkpoints" in str(e)):
            raise


def resume(accelerator, cfg: TrainConfig, start: Start, train, scheduler, metrics_log: MetricsLog) -> tuple[int, int]:
    """Load the checkpoint ``start`` names (already verified and checked against the config by
    :func:`rpt.training.resume.plan_start`); returns its step and ``data_position`` (samples read so far;
    ``(0, 0)``: no checkpoint)."""
    path, state = start.checkpoint, start.state
    if not path:
        if accelerator.is_main_process and os.path.exists(metrics_log.path):
            os.remove(metrics_log.path)
        return 0, 0
    if not start.verified:
        if accelerator.is_main_process:
            print(f"note: {path} was written before checkpoints carried manifest.json: its files are not verified "
                  "against hashes; each is read as plain data")
        check_plain_files(path)  # a hostile or damaged pickle refused by name before accelerate reads it
    # Before load_state: a mismatch in the data is one line, not an error deep in a loader.
    data_state = load_data_state(path, accelerator.process_index, accelerator.num_processes)
    if data_state:
        train.load_state_dict(data_state)
    from safetensors import SafetensorError

    try:
        load_accelerator_state(accelerator, path)
    except (pickle.UnpicklingError, SafetensorError, RuntimeError, KeyError, OSError, EOFError, ValueError) as e:
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: its model or optimizer state cannot be loaded into this run ({first}); "
                              "resume from another checkpoint or resume=none") from None
    # accelerate restores its count of micro-batches, which decides where accumulate() syncs: counted
    # under the split that wrote the checkpoint, it would end this run's first steps off their
    # boundaries when the accumulation changed (a resume with another micro-batch or process count).
    accelerator.step = 0
    load_scheduler_state(path, scheduler)
    step, position = int(state["step"]), int(state["data_position"])
    train.resume_at(step, position)  # a token store continues at the next unread sample
    if accelerator.is_main_process:
        metrics_log.truncate_after(step)
        print(f"resumed from {path} at step {step} (data position {position})")
        old_batch, batch = state.get("global_batch"), cfg.global_batch(accelerator.num_processes)
        if old_batch is not None and old_batch != batch:
            print(f"the global batch changed from {old_batch} to {batch} samples (world size "
                  f"{state.get('world_size')} -> {accelerator.num_processes}): continuing at sample {position}")
    return step, position


def save_checkpoint(accelerator, cfg: TrainConfig, step: int, data_position: int, scheduler,
                    data_state: dict | None = None, split: dict[str, Any] | None = None) -> None:
    final_path = os.path.join(cfg.output_dir, f"checkpoint-{step}")
    tmp = temp_dir_for(final_path)
    if accelerator.is_main_process:
        clear_dir(tmp)
    accelerator.wait_for_everyone()
    accelerator.save_state(tmp)
    save_data_state(tmp, accelerator.process_index, data_state or {})
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        write_json_atomic(os.path.join(tmp, "trainer_state.json"), {
            "step": step, "data_position": data_position, "world_size": accelerator.num_processes,
            "global_batch": cfg.global_batch(accelerator.num_processes), **(split or {}),
            "data_workers": cfg.data_workers, "config": cfg.to_dict(),
        })
        save_scheduler_state(tmp, scheduler)
        write_manifest(tmp)  # last: the hash of every file, verified before a resume reads any
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
        if cfg.lora is not None:
            save_lora_checkpoint(accelerator.unwrap_model(model), tmp, cfg.lora, lora_base(cfg), state, final_path)
        else:
            accelerator.unwrap_model(model).save_pretrained(tmp, state_dict=state)
        tokenizer.save_pretrained(tmp)
        with open(os.path.join(tmp, "training_config.yaml"), "w") as f:
            yaml.safe_dump(cfg.to_dict(), f, sort_keys=False)
        copy_segments(cfg.output_dir, tmp)  # how these weights were trained: each invocation's steps and changes
        commit_dir(tmp, final_path)
    accelerator.wait_for_everyone()


def lora_base(cfg: TrainConfig) -> str | None:
    """What a LoRA adapter's base is: the model's id or (absolute) path; None for a from-config model."""
    source = cfg.init_from or cfg.model
    if not isinstance(source, str):
        return None
    return os.path.abspath(source) if os.path.isdir(source) else source


# ---- the run -----------------------------------------------------------------------------------
def run(cfg: TrainConfig) -> dict[str, Any]:
    """Train per ``cfg``; returns the last logged metrics. Writes ``cfg.output_dir``."""
    from accelerate.utils import set_seed

    cfg, warmup_note = fit_warmup(cfg)
    if os.path.exists(cfg.output_dir) and not os.path.isdir(cfg.output_dir):
        raise ConfigError(f"config key 'output_dir' = {cfg.output_dir!r} is a file, not a directory; name a directory")
    os.makedirs(cfg.output_dir, exist_ok=True)
    accelerator = make_accelerator(cfg)
    check_backend(accelerator, cfg)
    check_split(cfg, accelerator.num_processes)  # the batch keys against the process count
    main, world, rank = accelerator.is_main_process, accelerator.num_processes, accelerator.process_index
    # Before any data, model or file is made: a refused resume costs nothing and rewrites nothing.
    start = plan_start(cfg, accelerator, deepspeed=getattr(accelerator.state, "deepspeed_plugin", None) is not None)
    set_seed(cfg.seed)

    with accelerator.main_process_first():  # the main process writes tokenizers first
        tokenizer = build_tokenizer(cfg)

    model = build_model(cfg, tokenizer)
    if main and cfg.lora is not None:
        print(parameter_line(model), flush=True)
    if main and cfg.compile:
        print(f"compile: {len(transformer_blocks(model))} transformer blocks compiled with {cfg.compile_backend} "
              "(on the first step; evaluation runs them eagerly)", flush=True)
    model.train()
    flops = flops_per_token(model, cfg.seq_len)  # counted on the bare model, before prepare wraps it
    optimizer = build_optimizer(model, cfg, accelerator.device)
    # Before prepare, which fixes DeepSpeed's micro-batch; the data is built for the split chosen.
    deepspeed = getattr(accelerator.state, "deepspeed_plugin", None) is not None
    split = choose_split(cfg, model, accelerator, deepspeed)
    steps_cfg = dataclasses.replace(cfg, micro_batch_size=split.micro, grad_accum=split.accum)  # the split, as run
    accelerator.gradient_accumulation_steps = split.accum
    draws = start.state.get("draws", LEGACY_DRAWS) if start.checkpoint else DRAWS
    with accelerator.main_process_first():  # the main process writes token stores first
        train = build_packed(steps_cfg, "train", tokenizer, rank, world)
        val = build_packed(cfg, "validation", tokenizer) if cfg.eval_batches > 0 else None
    # the tokens a data_position is a place in (a stream has no key); a resume over other tokens is refused
    data_key = train.data_key() if hasattr(train, "data_key") else None
    check_same_data(start, data_key, train)
    configure_deepspeed(accelerator, steps_cfg, model)
    model, optimizer = accelerator.prepare(model, optimizer)
    # Built after prepare (ZeRO-3 regroups the parameters) and left unprepared (accelerate would
    # step it once per process); checkpointed as JSON (rpt.checkpoint.directories), never as a pickle.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    ran = trained_precision(accelerator, model)
    if ran != cfg.precision:
        raise ConfigError(f"config key 'precision' is {cfg.precision} but the backend trains in {ran} (the accelerate "
                          f"launch config's mixed_precision or DeepSpeed JSON); make them agree")
    if main and getattr(accelerator.state, "deepspeed_plugin", None) is not None:
        print(f"DeepSpeed ZeRO-{zero_stage(accelerator)}: {ran}, gradient clipping {model.gradient_clipping()}, "
              f"micro-batch {model.train_micro_batch_size_per_gpu()}, accumulation {model.gradient_accumulation_steps()}")
    peak = device_peak_flops(accelerator.device, ran, cfg.peak_tflops)  # MFU against the dtype that runs
    speed = Throughput(flops, peak * world if peak else None)

    global_batch = steps_cfg.global_batch(world)
    metrics_log = MetricsLog(os.path.join(cfg.output_dir, "metrics.jsonl"))
    start_step, start_position = resume(accelerator, steps_cfg, start, train, scheduler, metrics_log)
    run_log = RunLog(cfg.output_dir, enabled=main, resume_step=start_step)
    backend = (f"DeepSpeed ZeRO-{zero_stage(accelerator)}" if getattr(accelerator.state, "deepspeed_plugin", None)
               else "DDP" if world > 1 else "single process")
    run_log.summary(summary_lines(steps_cfg, accelerator.unwrap_model(model), device=accelerator.device, precision=ran,
                                  world=world, backend=backend, train=train, val=val, start_step=start_step,
                                  start_position=start_position, warmup_note=warmup_note, split_note=split.line()))
    if cfg.report_to != "none":
        accelerator.init_trackers(cfg.project, config=cfg.to_dict(), init_kwargs={"wandb": {"name": cfg.run_name}} if cfg.report_to == "wandb" else {})
    if main:  # the run's record: config.yaml once, then one segment per invocation (rpt.training.run_record)
        write_config_record(cfg)
        append_segment(cfg, start_step, start.changed, start.checkpoint, split=split_record(split, draws))

    meter = LossMeter(accelerator.unwrap_model(model).window, accelerator.device)
    if not sys.stderr.isatty():  # no bars in a captured log: train.log's lines say the same
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    # disable=None: no bar where stderr is no terminal (train.log and stdout get plain lines there)
    bar = tqdm(total=cfg.max_steps, initial=start_step, disable=None if main else True, desc="train",
               dynamic_ncols=True)
    last: dict[str, Any] = {}
    speed.restart()
    for step in range(start_step + 1, cfg.max_steps + 1):
        # The global index of a micro-batch in the step: rank r's m-th micro-batch is the (m * world + r)-th,
        # so its samples (and, by their place in the global batch, their permutations) are the same
        # whatever the split of the global batch into processes x accumulation steps x micro-batches.
        micro_batches = (make_batch(cfg, train.micro_batch(step, m * world + rank), step, m * world + rank, draws)
                         for m in range(split.accum))
        grad_norm = train_step(accelerator, model, optimizer, micro_batches, meter, cfg.max_grad_norm)
        meter.note_step(step)
        logs = step % cfg.log_every == 0 or step == cfg.max_steps
        evals = val is not None and (step % cfg.eval_every == 0 or step == cfg.max_steps)
        saves = step % cfg.save_every == 0 or step == cfg.max_steps
        if logs or evals or saves:  # the check's one host read, where a result of the step would be kept
            stop_if_not_finite(accelerator, meter, cfg, bar)
        lr = scheduler.get_last_lr()[0]  # the rate this step used
        scheduler.step()
        speed.add(global_batch * cfg.seq_len)
        bar.update(1)

        position = start_position + (step - start_step) * global_batch  # samples read after this step
        row: dict[str, Any] = {}
        if logs:
            row = {"step": step, **meter.reduce(accelerator), "lr": lr,
                   "grad_norm": float(grad_norm) if grad_norm is not None else None, **speed.row(),
                   "peak_mem_mb": peak_memory_all_ranks(accelerator), "data_position": position}
            meter.reset()
        # Its own schedule: evaluating only on logged steps skipped eval_every steps log_every misses.
        if evals:
            metrics, per_batch = evaluate(model, cfg, val, accelerator, split.micro)
            row = {"step": step, **row, **metrics}
            if main:  # the latest evaluation's per-batch sums (intervals over validation batches)
                write_json_atomic(os.path.join(cfg.output_dir, "eval_batches.json"), {"step": step, **per_batch})
        if row:
            if main:
                metrics_log.write(row)
                run_log.write(step_line(row, cfg.max_steps))
                if "loss" in row:
                    bar.set_postfix_str(progress_line(row))
            if cfg.report_to != "none":
                accelerator.log({k: v for k, v in row.items() if v is not None}, step=step)
            last = row
            speed.restart()  # evaluation and logging time is not training throughput

        if saves:
            save_checkpoint(accelerator, cfg, step, position, scheduler, train.state_dict(),
                            {**split_record(split, draws), **({"data_key": data_key} if data_key else {})})
            speed.restart()
    bar.close()

    save_final(accelerator, model, tokenizer, cfg)
    replicas = replica_report(accelerator, model)
    if main:
        write_json_atomic(os.path.join(cfg.output_dir, "replicas.json"), replicas)
        if cfg.plot:
            png = plot_loss_curves(metrics_log.path, os.path.join(cfg.output_dir, "loss_curves.png"), title=f"{cfg.objective} w={cfg.window}")
            if png:
                print(f"wrote {png}")
        print(f"wrote {os.path.join(cfg.output_dir, 'final')} and {metrics_log.path}")
    # Every rank tears the process group down together: a rank that destroys it (and exits)
    # while rank 0 still writes files can abort rank 0's gloo threads at exit (seen in CI).
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return last


class TrainingDiverged(ValueError):
    """The training loss became NaN or inf: the run stops (its last checkpoint is kept)."""


_NO_BAD_STEP = 2.0**52  # above any step; exact in float64


def stop_if_not_finite(accelerator, meter: LossMeter, cfg: TrainConfig, bar=None) -> None:
    """Stop every rank together when any rank's loss became NaN or inf since the last check (a reduced
    value, so no rank is left waiting in the next collective), naming the earliest such step;
    called before anything of the step is logged, evaluated or saved."""
    # the earliest bad step over ranks as a max of (_NO_BAD_STEP - step), 0 where a rank has none
    bad = torch.where(meter.first_bad > 0, _NO_BAD_STEP - meter.first_bad.double(), 0.0).reshape(1)
    if accelerator.num_processes > 1:
        bad = accelerator.reduce(bad, "max")
    earliest = float(bad)
    if earliest > 0:
        step = int(_NO_BAD_STEP - earliest)
        if bar is not None:
            bar.close()  # the error goes on a line of its own, after the progress bar's
        kept = latest_checkpoint(cfg.output_dir)
        raise TrainingDiverged(f"the training loss became NaN or inf at step {step}; the run stopped without saving that "
                               f"step ({f'last good checkpoint: {kept}' if kept else 'no checkpoint was written yet'}): start "
                               "a new run (another output_dir) with a lower 'lr' or max_grad_norm > 0, or check the data")


def progress_line(row: dict[str, Any]) -> str:
    parts = [f"loss {row['loss']:.3f}"]
    if row.get("ntp_loss") is not None:
        parts.append(f"ntp {row['ntp_loss']:.3f}")
    parts.append(f"{row['tokens_per_s']:,.0f} tok/s")
    if row.get("mfu") is not None:
        parts.append(f"mfu {100 * row['mfu']:.1f}%")
    parts.append(f"mem {row['peak_mem_mb'] / 1024:.2f} GB")
    return " ".join(parts)


__all__ = ["run", "build_model", "evaluate", "make_batch", "LossMeter"]
