"""``rpt_engine_args(ckpt)``: the engine arguments that serve an RPT checkpoint with RPT requests,
``LLM(**rpt_engine_args(ckpt))``; docs/serving.md gives the same as ``vllm serve`` flags."""

from __future__ import annotations

from typing import Any

from rpt.checkpoint.rpt_config import read_rpt_config
from rpt.integrations.vllm_rpt.codes import chain_rows
from rpt.integrations.vllm_rpt.plugin import ARCHITECTURE

WORKER = "rpt.integrations.vllm_rpt.worker.RPTCPUWorker"
SCHEDULER = "rpt.integrations.vllm_rpt.scheduler.RPTScheduler"
DRAFTS = "rpt.integrations.vllm_rpt.drafts.Drafts"


def draft_slots(window: int) -> int:
    """Draft rows a step may feed: the tail (at most w tokens) and the chains of lags 1 .. w-1."""
    return window + chain_rows(window - 1)


def rpt_engine_args(checkpoint: str, **overrides: Any) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments for ``checkpoint`` (an RPT checkpoint directory) with RPT: the
    model class, the RPT worker and scheduler, the draft plumbing sized for its trained window, eager
    execution; ``overrides`` are added (``dtype``, ``max_model_len``, ``max_num_seqs``, ...)."""
    config = read_rpt_config(checkpoint)
    if config is None:
        raise ValueError(f"{checkpoint} is not an RPT checkpoint (no rpt_config.json): RPT needs its offset table; "
                         "serve it as a plain model, or save it with RPTForCausalLM.save_pretrained")
    args = {
        "model": str(checkpoint),
        "hf_overrides": {"architectures": [ARCHITECTURE]},
        "worker_cls": WORKER,
        "scheduler_cls": SCHEDULER,
        "speculative_config": {"method": "custom_class", "model": DRAFTS,
                               "num_speculative_tokens": draft_slots(config.window)},
        "enforce_eager": True,
    }
    args.update(overrides)
    return args
