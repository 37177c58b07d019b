"""``metrics.jsonl``: one JSON object per log step, appended; trimmed on resume."""

from __future__ import annotations

import json
from typing import Any

from rpt.append_log import LogLines, check_increasing, json_object, read_log
from rpt.result_files import write_atomic

METRICS_ROLE = "the run's metrics log (one JSON object per logged step)"


def metrics_row(text: str) -> dict[str, Any]:
    """One line of ``metrics.jsonl``: a JSON object with an integer ``step`` >= 1."""
    row = json_object(text)
    step = row.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise ValueError("not an object with an integer 'step' >= 1")
    return row


def read_metrics_log(path: str) -> LogLines:
    """``metrics.jsonl`` checked (:mod:`rpt.append_log`): a torn last row dropped, a damaged or
    out-of-order row an error naming the line."""
    rows = read_log(path, metrics_row, METRICS_ROLE, keep_unterminated=True)
    check_increasing(rows, lambda r: r["step"], METRICS_ROLE)
    return rows


def read_metrics(path: str) -> list[dict[str, Any]]:
    return read_metrics_log(path).items


class MetricsLog:
    """Append-only JSONL log. ``truncate_after(step)`` drops rows a killed run logged past the
    checkpoint it resumes from, so the file reads as one uninterrupted run."""

    def __init__(self, path: str):
        self.path = path

    def truncate_after(self, step: int) -> None:
        rows = [r for r in read_metrics(self.path) if r["step"] <= step]
        write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in rows))

    def write(self, row: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()


# ---- what a researcher watches: throughput, MFU, memory ------------------------------------------
# Dense peak TFLOP/s per device (NVIDIA / AMD data sheets): (name words, bf16/fp16 tensor, fp32).
# More specific names first ("H100 PCIe" before "H100"); others: set peak_tflops in the config.
PEAK_TFLOPS = [
    ("GH200", 989.0, 67.0), ("H200", 989.0, 67.0), ("H100 PCIe", 756.0, 51.0), ("H100 NVL", 835.0, 60.0),
    ("H100", 989.0, 67.0), ("B200", 2250.0, 80.0), ("A100", 312.0, 19.5), ("A10", 125.0, 31.2),
    ("L40S", 362.0, 91.6), ("L4", 121.0, 30.3), ("MI300X", 1307.0, 163.4), ("MI250", 362.0, 47.9),
]


def device_peak_flops(device, precision: str, override_tflops: float | None = None) -> float | None:
    """Peak FLOP/s of one device for ``precision``; None when unknown (e.g. a CPU) and not given."""
    if override_tflops is not None:
        return override_tflops * 1e12
    import torch

    if device.type != "cuda":
        return None
    import re

    name = torch.cuda.get_device_name(device)
    for fragment, half, full in PEAK_TFLOPS:
        if re.search(rf"\b{re.escape(fragment)}\b", name):  # whole words: "A10" is not "A10G"
            return (full if precision == "fp32" else half) * 1e12
    return None


def matmul_parameters(model) -> int:
    """Parameters used in a matmul per token: all but the input embedding tables (the output
    head counts, tied or not). ZeRO-3 partitions parameters, so their full size is ``ds_numel``."""
    def numel(p) -> int:
        return int(getattr(p, "ds_numel", p.numel()))

    total = sum(numel(p) for p in model.parameters())
    lookups = [model.offset_embedding.weight]
    embedding, head = model.lm.get_input_embeddings(), model.lm.get_output_embeddings()
    if head is None or head.weight is not embedding.weight:
        lookups.append(embedding.weight)
    return total - sum(numel(p) for p in lookups)


def attention_width(config) -> int:
    """``heads x head_dim``: the width of the attention scores' contraction, which is not
    ``hidden_size`` when ``head_dim`` is set apart from it (Qwen3-0.6B: 16 x 128 = 2048 vs 1024)."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return heads * head_dim


def flops_per_token(model, seq_len: int) -> float:
    """Training FLOPs per token, as PaLM appendix B and torchtitan count them: 6 N for the
    matmuls forward and backward plus 12 L (heads x head_dim) T for attention scores and values
    over T tokens."""
    config = model.lm.config
    return 6.0 * matmul_parameters(model) + 12.0 * config.num_hidden_layers * attention_width(config) * seq_len


def _proc_status_mb(field: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return None


def reset_cpu_peak() -> bool:
    """Reset the kernel's peak-RSS counter (VmHWM) to the current RSS; False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_memory_mb(device) -> float:
    """The most memory in use since the previous call, which resets it. CUDA: bytes allocated
    by tensors on ``device``. CPU: the process's peak resident set (Linux VmHWM, reset through
    ``/proc/self/clear_refs``; elsewhere the never-reset ``ru_maxrss``)."""
    import torch

    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        return peak / 2**20
    hwm = _proc_status_mb("VmHWM")
    if hwm is not None and reset_cpu_peak():
        return hwm
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def current_memory_mb() -> float | None:
    """The process's resident set now (Linux), for measuring what a piece of work adds."""
    return _proc_status_mb("VmRSS")


class Throughput:
    """Tokens/s and MFU over the training time since the last row (evaluation and checkpoint
    time excluded: call :meth:`restart` after them)."""

    def __init__(self, flops_per_token: float, peak_flops: float | None):
        import time

        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops
        self._clock = time.perf_counter
        self.restart()

    def restart(self) -> None:
        self.t0, self.tokens = self._clock(), 0

    def add(self, tokens: int) -> None:
        self.tokens += tokens

    def row(self) -> dict[str, float | None]:
        rate = self.tokens / max(self._clock() - self.t0, 1e-9)
        mfu = rate * self.flops_per_token / self.peak_flops if self.peak_flops else None
        return {"tokens_per_s": rate, "mfu": mfu}
