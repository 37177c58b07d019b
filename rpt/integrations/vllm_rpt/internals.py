"""Every vLLM internal the RPT integration relies on, with the versions it was checked against, and
the start-up check that refuses any other vLLM (one line naming the range).

vLLM's internals are not an API: a minor release may rename or re-plumb any of these. Each entry
names what the integration does with it; all were read and tested on vLLM 0.32.0 (the CPU build
``make test-vllm`` installs) and diffed unchanged against 0.33.0.
"""

from __future__ import annotations

from packaging.version import Version

SUPPORTED = (Version("0.32.0"), Version("0.34.0"))  # [checked, first unchecked)
CHECKED = ("0.32.0", "0.33.0")

OVERRIDDEN = {
    # model (rpt.integrations.vllm_rpt.model, side_attention)
    "vllm.model_executor.models.llama.LlamaForCausalLM.__init__(layer_type=) / forward / load_weights":
        "subclassed: ids carry offset codes, layers get true positions, the offset table loads after the weights",
    "vllm.model_executor.models.llama.LlamaDecoderLayer(attn_layer_type=)": "builds RPTLlamaAttention",
    "vllm.model_executor.models.llama.LlamaAttention.forward": "re-stated: rotary, stock attention, chain rows redone",
    "vllm.model_executor.layers.attention.attention.Attention (impl, kv_cache, layer_name)":
        "the chains' K/V written and attended through the layer's own backend",
    "vllm.v1.attention.backends.cpu_attn (CPUAttentionMetadata, do_kv_cache_update, forward, "
    "_custom_ops.cpu_attn_get_scheduler_metadata)": "the chains as virtual requests of the CPU kernel",
    "vllm.forward_context.get_forward_context().attn_metadata": "block table, query starts per layer",
    # runner (rpt.integrations.vllm_rpt.runner, worker, drafts)
    "vllm.v1.worker.gpu_model_runner.GPUModelRunner._sample": "RPT requests' rows answered by the driver",
    "vllm.v1.worker.gpu_model_runner.GPUModelRunner._update_states": "drivers dropped with finished requests",
    "vllm.v1.worker.gpu_model_runner.GPUModelRunner.propose_draft_token_ids": "the drivers' next rows as drafts",
    "vllm.v1.worker.gpu_model_runner.GPUModelRunner._input_fits_in_drafter": "never zero every request's drafts",
    "vllm.v1.worker.gpu_model_runner.GPUModelRunner.discard_request_mask": "partial prefills are not stepped",
    "vllm.v1.spec_decode.metadata.SpecDecodeMetadata (draft_token_ids, cu_num_sampled_tokens)":
        "each request's logits rows; chain codes cut to token ids for the stock sampler",
    "vllm.v1.sample.rejection_sampler.RejectionSampler.parse_output": "-1 pads mean 'emit nothing here'",
    "vllm.v1.worker.cpu_worker.CPUWorker.init_device (builds self.model_runner)": "builds RPTCPUModelRunner",
    "vllm.v1.spec_decode.custom_class_proposer (method custom_class)": "only switches the draft plumbing on",
    # scheduler (rpt.integrations.vllm_rpt.scheduler)
    "vllm.v1.core.sched.scheduler.Scheduler.add_request": "settings checked; budget set as Request.max_tokens",
    "vllm.v1.core.sched.scheduler.Scheduler.update_from_output":
        "a step that emitted nothing leaves num_computed_tokens = num_tokens - 1; refused requests finish",
    "vllm.v1.core.sched.scheduler.Scheduler.has_requests": "refused requests still get their output",
    "vllm.v1.core.sched.scheduler.Scheduler.dynamic_sd_lookup":
        "a constant table: no -1 padding drafts for new one-token requests (they mis-sample beside sampled ones)",
    "vllm.v1.engine.EngineCoreOutput(finish_reason=ERROR, stop_reason=message)": "a refused request's error",
}


def check_version(version: str | None = None) -> None:
    """Raise ``RuntimeError`` (one line) when the installed vLLM is outside :data:`SUPPORTED`."""
    if version is None:
        import vllm

        version = vllm.__version__
    found = Version(version.split("+")[0])
    low, high = SUPPORTED
    if not (low <= found < high):
        raise RuntimeError(f"RPT in vLLM supports vLLM >={low},<{high} (checked: {', '.join(CHECKED)}); this is vLLM "
                           f"{version}: install vllm>={low},<{high} (its internals change between releases), or decode "
                           "with rpt.sampling.generate")
