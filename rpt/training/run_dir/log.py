"""What a run says about itself in words: the start-up summary and ``train.log``.

``train.log`` (in the output directory) holds one plain line per logged step (and per evaluation
between logged steps: one per row of ``metrics.jsonl``) -- no carriage returns, no bar, no other
text. The start-up block goes to stdout and ``run_summary.txt``. The progress bar is for a
terminal only: where stdout is not one (a log file, ``make demo``'s background runs) the step
lines go to stdout instead, so a captured console reads like ``train.log``.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from rpt.append_log import LogLines, check_increasing, read_log
from rpt.result_files import write_atomic
from rpt.training.config import TrainConfig
from rpt.training.measure.metrics import read_metrics
from rpt.training.run_dir.record import read_segments

if TYPE_CHECKING:  # the annotation only: the split's module loads torch
    from rpt.training.micro_batch import Split


def count_parameters(model) -> tuple[int, int]:
    """(total, trainable) parameters; ZeRO-3 partitions report their full size (``ds_numel``)."""
    total = trainable = 0
    for p in model.parameters():
        n = int(getattr(p, "ds_numel", p.numel()))
        total += n
        trainable += n if p.requires_grad else 0
    return total, trainable


def _sequences(dataset) -> str:
    try:
        return f"{len(dataset):,} sequences"
    except TypeError:  # a streamed source has no length
        return "streamed"


def _source(cfg: TrainConfig) -> str:
    if cfg.init_from is not None:
        return f"init_from {cfg.init_from}"
    if isinstance(cfg.model, dict):
        return f"a new {cfg.model.get('model_type')} from its config"
    return str(cfg.model)


def summary_lines(cfg: TrainConfig, split: Split, model, *, device: Any, precision: str, world: int, backend: str,
                  train, val, start_step: int, start_position: int, warmup_note: str | None) -> list[str]:
    """The start-up block: model, parameters, device, precision, world size, tokens per step (the run's
    ``split``), data, schedule, where the run starts."""
    total, trainable = count_parameters(model)
    global_batch = split.global_batch(world)
    objective = (f"rpt (window {cfg.window}, s {cfg.s}, q {cfg.q})" if cfg.objective == "rpt" else "ntp")
    schedule = f"lr {cfg.lr:g}, warmup {cfg.warmup_steps} steps, {cfg.schedule}"
    if cfg.schedule != "constant":
        schedule += f" to {cfg.min_lr_ratio:g} x lr"
    lines = [
        f"run: {cfg.output_dir} -- objective {objective}, model {_source(cfg)}",
        f"parameters: {total:,} total, {trainable:,} trainable",
        f"device: {device} x {world} process{'es' if world > 1 else ''} ({backend}), precision {precision}",
        f"tokens per step: {global_batch * cfg.seq_len:,} (micro-batch {split.micro} x accumulation "
        f"{split.accum} x {world} process{'es' if world > 1 else ''} x {cfg.seq_len} tokens); "
        f"{cfg.max_steps} steps",
        *([split.line()] if split.line() else []),
        f"data: train {_sequences(train)}" + (f", validation {_sequences(val)} ({cfg.eval_batches} batches every "
                                              f"{cfg.eval_every} steps)" if val is not None else ", no validation"),
        f"schedule: {schedule}",
    ]
    if warmup_note:
        lines.append(warmup_note)
    lines.append(f"start: step {start_step} (data position {start_position})" if start_step
                 else "start: step 0 (a new run)")
    return lines


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e-2 or abs(value) >= 1e5 else f"{value:.4f}"
    return str(value)


def _loss_name(key: str) -> str:
    """``loss``, ``ntp_loss``, ``ptp_loss_1`` -> ``loss``, ``ntp``, ``ptp-1``."""
    return {"loss": "loss", "ntp_loss": "ntp"}.get(key) or "ptp-" + key.rsplit("_", 1)[-1]


def step_line(row: dict[str, Any], max_steps: int) -> str:
    """One logged step (and its evaluation, when there was one) as a plain line."""
    parts = [f"step {row['step']}/{max_steps}"]
    losses = [k for k in ("loss", "ntp_loss") if k in row] + sorted(k for k in row if k.startswith("ptp_loss_"))
    losses = [k for k in losses if row[k] is not None]  # an NTP run has no PTP losses
    parts += [f"{_loss_name(k)} {_fmt(row[k])}" for k in losses]
    if "lr" in row:
        parts.append(f"lr {row['lr']:.3g}")
    if row.get("grad_norm") is not None:
        parts.append(f"grad_norm {_fmt(row['grad_norm'])}")
    if row.get("tokens_per_s") is not None:
        parts.append(f"{row['tokens_per_s']:,.0f} tok/s")
    if row.get("mfu") is not None:
        parts.append(f"mfu {100 * row['mfu']:.1f}%")
    if row.get("peak_mem_mb") is not None:
        parts.append(f"mem {row['peak_mem_mb'] / 1024:.2f} GB")
    evals = [k for k in row if k == "eval_ntp_loss"] + sorted(k for k in row if k.startswith("eval_ptp_loss_"))
    evals = [k for k in evals if row[k] is not None]
    if evals:
        parts.append("| eval " + " ".join(f"{_loss_name(k.removeprefix('eval_'))} {_fmt(row[k])}" for k in evals))
    return " ".join(parts)


class RunLog:
    """``<output_dir>/train.log``: one line per row of ``metrics.jsonl`` (a logged step, or an
    evaluation between logged steps), nothing else, so it reads line for line like the metrics;
    on resume it is cut back to the checkpoint's step as the metrics are, then appended. The
    start-up block goes to stdout and ``<output_dir>/run_summary.txt``. Main process only; each
    step's line also goes to stdout when no progress bar shows it there."""

    def __init__(self, output_dir: str, enabled: bool, resume_step: int):
        self.path = os.path.join(output_dir, "train.log")
        self.summary_path = os.path.join(output_dir, "run_summary.txt")
        self.enabled = enabled
        self.echo = enabled and not sys.stderr.isatty()  # the bar (on stderr) shows only on a terminal
        if enabled and (os.path.exists(self.path) or resume_step):
            self._keep_through(resume_step)

    def _keep_through(self, step: int) -> None:
        """Drop the lines of steps after ``step`` (a killed run logged past its checkpoint), and make
        the rest agree with ``metrics.jsonl`` (already cut back to ``step``), one line per row: a line
        lost to a kill between the two writes is written again from its row, a line without a row goes."""
        log = read_train_log(self.path)  # a torn last line is dropped here (rpt.training.run_dir.file_checks said so at start-up)
        kept = {s: text for s, text in log.items if s <= step}
        metrics = os.path.join(os.path.dirname(self.path), "metrics.jsonl")
        if os.path.exists(metrics):  # without it there is nothing to agree with: the lines are kept
            rows = [r for r in read_metrics(metrics) if r["step"] <= step]
            if list(kept) != [r["step"] for r in rows]:
                lost = sorted({r["step"] for r in rows} ^ set(kept))
                print(f"note: {self.path} disagreed with {metrics} about step(s) {_steps(lost)}; rewritten to one line "
                      "per row of the metrics", flush=True)
                planned = _planned_max_steps(os.path.dirname(self.path))
                kept = {r["step"]: kept.get(r["step"]) or step_line(r, planned(r["step"])) for r in rows}
        write_atomic(self.path, "".join(text + "\n" for text in kept.values()))

    def write(self, line: str) -> None:
        if not self.enabled:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
        if self.echo:
            print(line, flush=True)

    def summary(self, lines: list[str]) -> None:
        """The start-up block: on stdout (bar or not) and in ``run_summary.txt`` (this start's)."""
        if not self.enabled:
            return
        write_atomic(self.summary_path, "".join(line + "\n" for line in lines))
        print("\n".join(lines), flush=True)


def line_step(line: str) -> int | None:
    """The step of a ``train.log`` line (``step 20/300 ...``), None for anything else."""
    parts = line.split(maxsplit=2)
    if len(parts) < 2 or parts[0] != "step" or not parts[1].split("/")[0].isdigit():
        return None
    return int(parts[1].split("/")[0])


TRAIN_LOG_ROLE = "the run's train.log (one 'step N/M ...' line per row of metrics.jsonl)"


def _log_line(text: str) -> tuple[int, str]:
    step = line_step(text)
    if step is None:
        raise ValueError("not a 'step N/M ...' line")
    return step, text.rstrip("\r")


def read_train_log(path: str) -> LogLines:
    """``train.log`` as ``(step, line)`` items, checked (:mod:`rpt.append_log`): a torn last line
    dropped, any other line that is not a step line, or a step out of order, an error naming it."""
    log = read_log(path, _log_line, TRAIN_LOG_ROLE)
    check_increasing(log, lambda item: item[0], TRAIN_LOG_ROLE)
    return log


def _planned_max_steps(output_dir: str):
    """step -> the ``max_steps`` of the invocation that trained it (``segments.jsonl``), for a line
    written again; the denominator of ``step N/M`` is what that invocation printed."""
    segments = sorted((s["from_step"], s["max_steps"]) for s in read_segments(output_dir))

    def planned(step: int) -> int | str:
        earlier = [m for start, m in segments if start < step]
        return earlier[-1] if earlier else "?"

    return planned


def _steps(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:8])) + (" ..." if len(steps) > 8 else "")
