"""One training step: the objective's batch of a micro-batch, the forward, the loss meter, the optimizer step.

Each optimiser step consumes one *global batch* of ``micro_batch_size x grad_accum x world`` packed
chunks (:mod:`rpt.training.micro_batch` splits a ``global_batch_size``), and the permutation of
sequence ``k`` of the global batch of step ``t`` comes from a generator seeded with ``(seed, t, k)``
(:func:`make_batch`): a 2-process run, or another micro-batch, sees the same global batch as a
1-process run with twice the accumulation. (:data:`LEGACY_DRAWS` seeds global micro-batch ``j``
with ``(seed, t, j)``: a checkpoint that records no keying resumes so.) A step reads nothing
back from the device; :func:`stop_if_not_finite` is the one host read, where a step's result is kept.
"""

from __future__ import annotations

import contextlib

import torch

from rpt.checkpoint.directories import latest_checkpoint
from rpt.model.objective import RPTBatch, make_rpt_batch, ntp_batch
from rpt.training.compiled_blocks import eager_blocks
from rpt.training.config import TrainConfig
from rpt.training.run_dir.lock import LockLost, lost_reason

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


def stop_if_lock_lost(accelerator, cfg: TrainConfig, step: int, bar=None) -> None:
    """Stop every rank together, before anything of ``step`` is written, when the main process's lock on
    ``output_dir`` was taken by another trainer (``train.py --break-lock``): two trainers never write one run."""
    why = lost_reason(cfg.output_dir) if accelerator.is_main_process else None
    lost = why is not None
    if accelerator.num_processes > 1:  # every rank learns it (none is left waiting in a collective)
        lost = float(accelerator.reduce(torch.tensor([float(lost)], device=accelerator.device), "max")) > 0
    if lost:
        if bar is not None:
            bar.close()
        kept = latest_checkpoint(cfg.output_dir)
        raise LockLost(f"{why or 'the run lock was taken by another trainer'}; this trainer stopped before writing step "
                       f"{step} (the other one now writes {cfg.output_dir}; its last checkpoint: {kept or 'none'})")


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
