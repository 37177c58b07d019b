"""How a global batch is split: the micro-batch a device holds, and the accumulation that keeps the batch.

``global_batch_size`` is the sequences per optimizer step over all processes; each process runs
``global / processes`` of them as ``grad_accum`` forwards of ``micro_batch_size``. With
``micro_batch_size: auto`` the run picks the largest micro-batch that divides its share and fits with
:data:`HEADROOM` of the device's memory to spare (evaluation, checkpoint copies, the allocator's
fragmentation), and every rank takes the minimum over ranks:

* on a CUDA device, a search: a trial step (forward and backward of a batch of that size, the
  optimizer's state added, which the first real step allocates) at one and two sequences gives the
  memory per sequence, hence an upper bound; from there accelerate's ``find_executable_batch_size``
  walks down the divisors, catching the device's out-of-memory error (and a peak over the budget);
* on the CPU, which has no out-of-memory error to catch (the OS kills the process), and under
  DeepSpeed, which fixes the micro-batch in its engine before a trial could run, an estimate from the
  model's shape against the free memory, said so in the start-up block.

Either way only micro-batches up to :data:`MAX_MICRO_BATCH` are considered, so a huge
``global_batch_size`` costs the choice no more than a small one; the start-up line says what was
considered and tried.

The split does not change what is trained: the objective's draws are keyed per sequence of the global
batch (``rpt.training.step.make_batch``), and the step's gradient is the mean over the global batch.
The run holds its config and its :class:`Split` (:func:`choose_split`); the data, DeepSpeed's engine, the
start-up block, the restore and every checkpoint read the micro-batch and accumulation from the split.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rpt.training.config import ConfigError, TrainConfig
from rpt.training.step import trial_step

HEADROOM = 0.10  # of the device's memory left free by the chosen micro-batch's training step
# The largest micro-batch ``auto`` considers: far above what a device holds of any model worth
# training, and it bounds the search's work whatever ``global_batch_size`` is.
MAX_MICRO_BATCH = 1 << 16
GIB = 2**30


def size(nbytes: float) -> str:
    return f"{nbytes / GIB:.2f} GiB" if nbytes >= GIB / 10 else f"{nbytes / 2**20:.1f} MiB"


@dataclass(frozen=True)
class Split:
    """``micro`` sequences per forward, ``accum`` forwards per optimizer step on each process."""

    micro: int
    accum: int
    how: str | None = None  # how an automatic micro-batch was chosen (None: set in the config)

    def line(self) -> str | None:
        return None if self.how is None else f"micro-batch: auto -> {self.micro}, accumulation {self.accum} ({self.how})"

    def global_batch(self, world: int) -> int:
        """Sequences per optimizer step over ``world`` processes."""
        return self.micro * self.accum * world

    def record(self, draws: str) -> dict[str, Any]:
        """What the run record and every checkpoint say of the split run and the keying of the draws."""
        return {"micro_batch_size": self.micro, "grad_accum": self.accum, "micro_batch_choice": self.how, "draws": draws}


def per_process(cfg: TrainConfig, world: int) -> int:
    """The sequences of one process per optimizer step under ``global_batch_size``."""
    if cfg.global_batch_size % world:
        raise ConfigError(f"config key 'global_batch_size' = {cfg.global_batch_size} does not split over {world} "
                          f"processes; use a multiple of {world}")
    return cfg.global_batch_size // world


def fixed_split(cfg: TrainConfig, world: int) -> Split | None:
    """The split a config states (None for ``micro_batch_size: auto``); a ``grad_accum`` that contradicts
    ``global_batch_size`` on ``world`` processes is one :class:`ConfigError`."""
    if cfg.micro_batch_size == "auto":
        return None
    if cfg.global_batch_size is None:
        return Split(cfg.micro_batch_size, cfg.grad_accum or 1)
    share = per_process(cfg, world)
    accum, rest = divmod(share, cfg.micro_batch_size)
    if rest:
        raise ConfigError(f"config key 'global_batch_size' = {cfg.global_batch_size} is not micro_batch_size "
                          f"{cfg.micro_batch_size} x an accumulation x {world} processes; change one of them")
    if cfg.grad_accum is not None and cfg.grad_accum != accum:
        raise ConfigError(f"config key 'grad_accum' = {cfg.grad_accum} contradicts global_batch_size "
                          f"{cfg.global_batch_size} = micro_batch_size {cfg.micro_batch_size} x grad_accum {accum} x "
                          f"{world} process{'es' if world > 1 else ''}; remove grad_accum (it follows) or make them agree")
    return Split(cfg.micro_batch_size, accum)


def check_split(cfg: TrainConfig, world: int) -> None:
    """The batch keys split over ``world`` processes (a :class:`ConfigError` naming the key if not)."""
    if cfg.global_batch_size is not None:
        per_process(cfg, world)
    fixed_split(cfg, world)


def divisors(n: int, at_most: int | None = None) -> list[int]:
    """The divisors of ``n`` up to ``at_most`` (default ``n``), largest first: the micro-batches that keep
    a share of ``n`` sequences. ``min(at_most, sqrt(n))`` steps, so a huge ``n`` costs no more than the cap."""
    cap = n if at_most is None else max(1, min(n, at_most))
    root = math.isqrt(n)
    if cap <= root:
        return [d for d in range(cap, 0, -1) if n % d == 0]
    small = [d for d in range(1, root + 1) if n % d == 0]
    return sorted({d for d in small} | {n // d for d in small if n // d <= cap}, reverse=True)


def considered(share: int) -> str:
    """What the automatic choice looked at, for its start-up line."""
    if share <= MAX_MICRO_BATCH:
        return f"the divisors of the share {share}"
    return f"the divisors of the share {share} up to {MAX_MICRO_BATCH} (the cap on an automatic micro-batch)"


def search(share: int, fits: Callable[[int], None], start: int) -> tuple[int, list[int]]:
    """The largest divisor of ``share`` at most ``start`` for which ``fits(m)`` raises no out-of-memory
    error, and every micro-batch tried (accelerate's ``find_executable_batch_size``, stepping down the
    divisors). Any other error propagates; a ConfigError when not even one sequence fits."""
    from accelerate.utils import find_executable_batch_size

    candidates = iter(divisors(share, min(start, MAX_MICRO_BATCH)))
    tried: list[int] = []

    def attempt(micro: int) -> int:
        tried.append(micro)
        fits(micro)
        return micro

    try:
        return find_executable_batch_size(attempt, next(candidates), lambda: next(candidates, 0))(), tried
    except RuntimeError as e:
        if "No executable batch size found" not in str(e):
            raise
        raise ConfigError("micro_batch_size: auto found no micro-batch that fits: even one sequence of seq_len runs out "
                          "of memory; turn on gradient_checkpointing, lower seq_len, or shard the model "
                          "(DeepSpeed ZeRO)") from None


def start_from_probes(share: int, peak_1: int, peak_2: int | None, budget: int) -> int:
    """The upper bound the search starts from: the peak memory is linear in the micro-batch (the
    activations), so two trial peaks give the largest micro-batch whose peak stays within ``budget``."""
    if peak_2 is None:
        return 1
    per_sequence = max(1, peak_2 - peak_1)
    return max(1, min(share, MAX_MICRO_BATCH, 1 + (budget - peak_1) // per_sequence))


def trainable_bytes(model: torch.nn.Module) -> int:
    """The bytes of the trainable parameters (whole: ZeRO-3 holds a partitioned one as ``ds_numel``)."""
    return sum(getattr(p, "ds_numel", p.numel()) * p.element_size() for p in model.parameters() if p.requires_grad)


def optimizer_state_bytes(model: torch.nn.Module) -> int:
    """AdamW's two moments per trainable parameter, which the first optimizer step allocates."""
    return 2 * trainable_bytes(model)


def activation_bytes_per_token(model: torch.nn.Module, precision: str, checkpointing: bool) -> int:
    """An estimate of the memory a training step keeps per token for the backward pass of a decoder:
    per layer the float32 residual stream at both norms, and in the compute dtype the normed inputs,
    q, k, v, the attention output, the four MLP intermediates; with gradient checkpointing only each
    block's input, plus one block recomputed at a time."""
    config = model.config
    hidden = config.hidden_size
    layers = config.num_hidden_layers
    inter = getattr(config, "intermediate_size", None) or 4 * hidden
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv = (getattr(config, "num_key_value_heads", None) or heads) * head_dim
    width = 2 if precision in ("bf16", "fp16") else 4
    block = 4 * 2 * hidden + width * (2 * hidden + heads * head_dim + 2 * kv + hidden + 4 * inter)
    kept = layers * 4 * hidden + block if checkpointing else layers * block
    return kept + 4 * hidden + width * hidden  # the embeddings' sum and the final norm (the loss is tiled)


def available_bytes(device: torch.device) -> tuple[int, str]:
    """Memory a process may use on ``device`` and where the figure comes from."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return free, f"{size(free)} free of {size(total)} on {torch.cuda.get_device_name(device)}"
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        free = info["MemAvailable"]
    except (OSError, KeyError, ValueError, IndexError):
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # processes of this machine share its memory
    return free // local, f"{size(free)} available" + (f" / {local} local processes" if local > 1 else "")


def estimate(cfg: TrainConfig, model: torch.nn.Module, share: int, device: torch.device, reason: str) -> Split:
    """The largest divisor of ``share`` whose estimated activations, with the gradients and optimizer
    state still to be allocated, fit in the free memory less the headroom."""
    free, where = available_bytes(device)
    budget = free * (1 - HEADROOM) - 3 * trainable_bytes(model)  # gradients + AdamW's two moments
    per_sequence = activation_bytes_per_token(model, cfg.precision, cfg.gradient_checkpointing) * cfg.seq_len
    fit = max(1, int(budget // per_sequence)) if per_sequence > 0 and budget > 0 else 1
    micro = divisors(share, min(fit, MAX_MICRO_BATCH))[0]
    return Split(micro, share // micro, f"{reason}: an estimate of {size(per_sequence)} per sequence against "
                                         f"{where}, {HEADROOM:.0%} kept free; {considered(share)}")


class DeviceMemory:
    """A CUDA device's memory as the search reads it: the budget, and the peak of a trial step."""

    def __init__(self, device: torch.device):
        self.device = device

    def budget(self) -> int:
        free, total = torch.cuda.mem_get_info(self.device)
        others = total - free - torch.cuda.memory_reserved(self.device)  # the context and other processes
        return int(total * (1 - HEADROOM)) - others

    def peak(self, run: Callable[[], None]) -> int:
        torch.cuda.reset_peak_memory_stats(self.device)
        run()
        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device)

    def release(self) -> None:
        from accelerate.utils import clear_device_cache

        clear_device_cache(garbage_collection=True)
        torch.cuda.reset_peak_memory_stats(self.device)


def searched(share: int, trial: Callable[[int], None], memory, extra: int) -> Split:
    """The split found by trial steps on ``memory``'s device (``extra``: bytes the real step adds to a
    trial's peak -- the optimizer state -- counted against the budget)."""
    total = memory.budget()  # read once: the figure the search runs against is the one it reports
    budget = total - extra
    peaks: dict[int, int] = {}

    def fits(micro: int) -> None:
        if micro not in peaks:  # a probe the search comes back to is not run twice
            try:
                peaks[micro] = memory.peak(lambda: trial(micro))
            finally:
                memory.release()
        if peaks[micro] > budget:
            # accelerate's search steps down on this message, as on the device's own
            raise torch.OutOfMemoryError(f"micro-batch {micro} needs {size(peaks[micro])} of the {size(budget)} "
                                         "budget: out of memory.")

    start = share
    try:
        fits(1)
        if share > 1:
            fits(2)
        start = start_from_probes(share, peaks[1], peaks.get(2), budget)
    except torch.OutOfMemoryError:
        start = 1  # the search below says that nothing fits
    micro, tried = search(share, fits, start)
    over = [m for m in tried if m > micro]
    how = (f"searched on {memory.device}: peak {size(peaks[micro])} + optimizer state {size(extra)} of "
           f"{size(total)} ({HEADROOM:.0%} of the device kept free)"
           + f"; tried {', '.join(map(str, tried))} of {considered(share)}"
           + (f"; {', '.join(map(str, over))} did not fit" if over else "")
           + (f"; {share} is the whole share of this process" if micro == share else ""))
    return Split(micro, share // micro, how)


def choose(cfg: TrainConfig, world: int, model: torch.nn.Module, device: torch.device, deepspeed: bool,
           trial: Callable[[int], None], reduce_min: Callable[[int], int], memory=None) -> Split:
    """The run's split: the config's, or for ``micro_batch_size: auto`` the largest micro-batch found
    (searched on CUDA, estimated elsewhere), the minimum over ranks (``reduce_min``)."""
    split = fixed_split(cfg, world)
    if split is not None:
        return split
    share = per_process(cfg, world)
    if memory is None and device.type == "cuda" and not deepspeed:
        memory = DeviceMemory(device)
    if memory is not None:
        # DDP keeps a bucket per gradient beside the gradients themselves; the trial runs the bare model
        buckets = trainable_bytes(model) if world > 1 else 0
        split = searched(share, trial, memory, optimizer_state_bytes(model) + buckets)
    else:
        reason = ("DeepSpeed fixes the micro-batch in its engine before a trial step could run" if deepspeed
                  else f"the {device.type.upper()} has no out-of-memory error to search by")
        split = estimate(cfg, model, share, device, reason)
    micro = reduce_min(split.micro)
    if micro != split.micro:  # another rank holds less: its micro-batch, which divides the same share
        split = Split(micro, share // micro, f"{split.how}; {micro}, the smallest over the ranks")
    return split


def choose_split(cfg: TrainConfig, model, accelerator, deepspeed: bool) -> Split:
    """The run's micro-batch and accumulation (:func:`choose`, trial steps by
    :func:`rpt.training.step.trial_step`), the same on every rank."""
    def reduce_min(micro: int) -> int:
        return -int(accelerator.reduce(torch.tensor(-micro, device=accelerator.device), "max"))

    split = choose(cfg, accelerator.num_processes, model, accelerator.device, deepspeed,
                   lambda micro: trial_step(model, cfg, micro, accelerator.device, accelerator.autocast), reduce_min)
    if cfg.objective == "rpt" and str(cfg.attn_implementation).startswith("flash_attention") and split.micro == 1:
        raise ConfigError("micro_batch_size: auto chose 1, and flash attention with micro_batch_size 1 reads an "
                          "RPT-permuted sequence as packed sequences; use attn_implementation: sdpa or gradient_checkpointing")
    return split
