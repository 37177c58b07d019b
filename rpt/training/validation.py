"""Evaluation during training: the validation batches, their split over ranks, the losses by kind.

Every rank runs every forward (DDP and ZeRO-3 need each rank in each one): ranks with no batch left
run a fully masked one. The PTP batches are permuted with generators fixed by the batch index, not by
the training seed, so runs with different seeds are scored on the same targets.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from rpt.model.objective import IGNORE_INDEX, RPTBatch, make_rpt_batch, ntp_batch
from rpt.training.compiled_blocks import eager_blocks
from rpt.training.config import TrainConfig
from rpt.training.step import LossMeter, forward


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
