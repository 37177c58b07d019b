"""The ``vllm.general_plugins`` entry point: registers the RPT model class in every vLLM process
(the engine core and each worker load general plugins; plain engines are unaffected: the class is
used only where ``hf_overrides`` names its architecture)."""

from __future__ import annotations

ARCHITECTURE = "RPTLlamaForCausalLM"


def register() -> None:
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        # a "module:Class" string: vLLM imports it only in an engine that serves it
        ModelRegistry.register_model(ARCHITECTURE, "rpt.integrations.vllm_rpt.model:RPTLlamaForCausalLM")
