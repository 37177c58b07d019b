"""The training loop on ``accelerate``: one CPU, one GPU, DDP, or DeepSpeed ZeRO-2/3.

:func:`run` is the loop and only the loop: it builds the run (:mod:`rpt.training.setup`), decides
where it starts (:mod:`rpt.training.run_dir.resume`, :func:`rpt.training.saving.restore`), then per step
runs the step (:mod:`rpt.training.step`), logs, evaluates (:mod:`rpt.training.validation`) and saves
(:mod:`rpt.training.saving`) on their own schedules. With a token store (every non-streamed source)
sample ``i`` of the run is a pure function of the seed (:mod:`rpt.data.packed`) and the step's
permutations are keyed by place in the global batch (:func:`rpt.training.step.make_batch`): a run
resumed from ``checkpoint-<t>`` sees exactly the data and permutations the uninterrupted run saw.
Streamed data is split by rank and its position saved per rank (:mod:`rpt.data.rank_stream`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

import torch
from tqdm.auto import tqdm

from rpt.checkpoint.directories import write_json_atomic
from rpt.data import build_packed, build_tokenizer
from rpt.data.run_data import check_vocabulary
from rpt.model.lora import parameter_line
from rpt.training.compiled_blocks import transformer_blocks
from rpt.training.config import ConfigError, TrainConfig
from rpt.training.measure.metrics import (
    MetricsLog,
    Throughput,
    device_peak_flops,
    flops_per_token,
    peak_memory_mb,
)
from rpt.training.measure.plotting import plot_loss_curves
from rpt.training.micro_batch import check_split, choose_split
from rpt.training.run_dir.log import RunLog, step_line, summary_lines
from rpt.training.run_dir.record import append_segment, write_config_record
from rpt.training.run_dir.resume import check_same_data, plan_start
from rpt.training.saving import restore, save_checkpoint, save_final
from rpt.training.setup import (
    build_model,
    build_optimizer,
    check_backend,
    configure_deepspeed,
    fit_warmup,
    lr_lambda,
    make_accelerator,
    trained_precision,
    zero_stage,
)
from rpt.training.step import (
    DRAWS,
    LEGACY_DRAWS,
    LossMeter,
    make_batch,
    stop_if_lock_lost,
    stop_if_not_finite,
    train_step,
)
from rpt.training.validation import evaluate


def run(cfg: TrainConfig) -> dict[str, Any]:
    """Train per ``cfg``, resuming from ``cfg.output_dir``'s latest checkpoint when it holds one (``resume: auto``).

    Args:
        cfg: the run's settings (:func:`rpt.training.config.load_config`, or a validated ``TrainConfig``).

    Returns:
        The last logged metrics row: ``step``, ``loss``, ``ntp_loss``, ``ptp_loss_<l>``, ``lr``,
        ``grad_norm``, ``tokens_per_s``, ``peak_mem_mb``, ``data_position`` and, on evaluation steps,
        the validation losses. ``cfg.output_dir`` then holds ``final/`` (an RPT checkpoint),
        ``checkpoint-<step>/``, ``metrics.jsonl``, ``train.log`` and the run's record.

    Raises:
        rpt.errors.ConfigError: a setting the run cannot use (an ``output_dir`` that is a file, a refused
            resume, a precision the backend does not train in), before any step.

    Example:
        Two steps of a 1-layer Llama on a tiny local text file, its tokenizer trained on the file:

        >>> import contextlib, io, os, tempfile
        >>> from rpt.training.config import TrainConfig, validate
        >>> from rpt.training.loop import run
        >>> tmp = tempfile.mkdtemp()
        >>> corpus = os.path.join(tmp, "corpus.txt")
        >>> with open(corpus, "w") as f:
        ...     _ = f.write("def add(a, b):\\n    return a + b\\n" * 50)
        >>> cfg = TrainConfig(model={"model_type": "llama", "hidden_size": 16, "intermediate_size": 32,
        ...                          "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2},
        ...                   tokenizer={"train_bpe": {"vocab_size": 300}}, data={"path": corpus}, val_fraction=0.0,
        ...                   eval_batches=0, seq_len=16, micro_batch_size=2, max_steps=2, warmup_steps=1, q=0.5,
        ...                   plot=False, cache_dir=os.path.join(tmp, "cache"), output_dir=os.path.join(tmp, "run"))
        >>> validate(cfg)
        >>> with contextlib.redirect_stdout(io.StringIO()):  # the run's summary and step lines
        ...     metrics = run(cfg)
        >>> metrics["step"], metrics["loss"] > 0
        (2, True)
        >>> sorted(os.listdir(os.path.join(tmp, "run", "final")))[:3]
        ['config.json', 'custom_generate', 'generation_config.json']
    """
    from accelerate.utils import set_seed

    cfg, warmup_note = fit_warmup(cfg)
    if os.path.exists(cfg.output_dir) and not os.path.isdir(cfg.output_dir):
        raise ConfigError(f"config key 'output_dir' = {cfg.output_dir!r} is a file, not a directory; name a directory")
    os.makedirs(cfg.output_dir, exist_ok=True)
    accelerator = make_accelerator(cfg)
    check_backend(accelerator, cfg)
    check_split(cfg, accelerator.num_processes)  # the batch keys against the process count
    main, world, rank = accelerator.is_main_process, accelerator.num_processes, accelerator.process_index
    deepspeed = getattr(accelerator.state, "deepspeed_plugin", None) is not None
    # Before any data, model or file is made: a refused resume costs nothing and rewrites nothing.
    start = plan_start(cfg, accelerator, deepspeed=deepspeed)
    # the keying of the objective's draws: a resume's is its checkpoint's (plan_start refused a config
    # naming another), a new run's the config's; stated in the run's record and every config it saves
    draws = start.state.get("draws", LEGACY_DRAWS) if start.checkpoint else (cfg.draws or DRAWS)
    cfg = dataclasses.replace(cfg, draws=draws)
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
    split = choose_split(cfg, model, accelerator, deepspeed)  # the micro-batch and accumulation, as run
    global_batch = split.global_batch(world)
    accelerator.gradient_accumulation_steps = split.accum
    with accelerator.main_process_first():  # the main process writes token stores first
        train = build_packed(cfg, "train", tokenizer, rank, world, micro_batch_size=split.micro, global_batch=global_batch)
        val = build_packed(cfg, "validation", tokenizer) if cfg.eval_batches > 0 else None
    # the tokens a data_position is a place in (a stream has no key); a resume over other tokens is refused
    data_key = train.data_key() if hasattr(train, "data_key") else None
    check_same_data(start, data_key, train)
    check_vocabulary(model.lm.get_input_embeddings().num_embeddings, train, val)  # before the first step
    configure_deepspeed(accelerator, cfg, split, model)
    model, optimizer = accelerator.prepare(model, optimizer)
    # Built after prepare (ZeRO-3 regroups the parameters) and left unprepared (accelerate would
    # step it once per process); checkpointed as JSON (rpt.checkpoint.directories), never as a pickle.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    ran = trained_precision(accelerator, model)
    if ran != cfg.precision:
        raise ConfigError(f"config key 'precision' is {cfg.precision} but the backend trains in {ran} (the accelerate "
                          f"launch config's mixed_precision or DeepSpeed JSON); make them agree")
    if main and deepspeed:
        print(f"DeepSpeed ZeRO-{zero_stage(accelerator)}: {ran}, gradient clipping {model.gradient_clipping()}, "
              f"micro-batch {model.train_micro_batch_size_per_gpu()}, accumulation {model.gradient_accumulation_steps()}")
    peak = device_peak_flops(accelerator.device, ran, cfg.peak_tflops)  # MFU against the dtype that runs
    speed = Throughput(flops, peak * world if peak else None)

    metrics_log = MetricsLog(os.path.join(cfg.output_dir, "metrics.jsonl"))
    start_step, start_position = restore(accelerator, cfg, start, train, scheduler, metrics_log, global_batch)
    run_log = RunLog(cfg.output_dir, enabled=main, resume_step=start_step)
    backend = (f"DeepSpeed ZeRO-{zero_stage(accelerator)}" if deepspeed
               else "DDP" if world > 1 else "single process")
    run_log.summary(summary_lines(cfg, split, accelerator.unwrap_model(model), device=accelerator.device, precision=ran,
                                  world=world, backend=backend, train=train, val=val, start_step=start_step,
                                  start_position=start_position, warmup_note=warmup_note))
    if cfg.report_to != "none":
        accelerator.init_trackers(cfg.project, config=cfg.to_dict(), init_kwargs={"wandb": {"name": cfg.run_name}} if cfg.report_to == "wandb" else {})
    if main:  # the run's record: config.yaml once, then one segment per invocation (rpt.training.run_dir.record)
        write_config_record(cfg)
        append_segment(cfg, start_step, start.changed, start.checkpoint, split=split.record(draws))

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
            stop_if_lock_lost(accelerator, cfg, step, bar)  # one read of run.lock: still this trainer's?
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
                            {**split.record(draws), **({"data_key": data_key} if data_key else {}),
                             **({"data_files": train.stamps()} if hasattr(train, "stamps") else {})})
            speed.restart()
    bar.close()

    stop_if_lock_lost(accelerator, cfg, cfg.max_steps)
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


def peak_memory_all_ranks(accelerator) -> float:
    """The largest peak memory (MB) of any rank since the previous call (rpt.training.measure.metrics)."""
    mine = torch.tensor(peak_memory_mb(accelerator.device), device=accelerator.device)
    return float(accelerator.reduce(mine, "max"))


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


def progress_line(row: dict[str, Any]) -> str:
    parts = [f"loss {row['loss']:.3f}"]
    if row.get("ntp_loss") is not None:
        parts.append(f"ntp {row['ntp_loss']:.3f}")
    parts.append(f"{row['tokens_per_s']:,.0f} tok/s")
    if row.get("mfu") is not None:
        parts.append(f"mfu {100 * row['mfu']:.1f}%")
    parts.append(f"mem {row['peak_mem_mb'] / 1024:.2f} GB")
    return " ".join(parts)
