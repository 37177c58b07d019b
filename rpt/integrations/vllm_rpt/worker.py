"""``--worker-cls rpt.integrations.vllm_rpt.worker.RPTCPUWorker``: vLLM's CPU worker, building the
RPT model runner (:mod:`.runner`) where it builds its own."""

from __future__ import annotations

import torch
from vllm.v1.worker.cpu_worker import CPUWorker

from rpt.integrations.vllm_rpt.internals import check_version
from rpt.integrations.vllm_rpt.runner import RPTCPUModelRunner


class RPTCPUWorker(CPUWorker):
    def init_device(self):
        check_version()
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            raise RuntimeError("RPT in vLLM runs on vLLM's CPU worker only (its chain attention uses the CPU attention "
                               "kernel); on a GPU decode with rpt.sampling.generate")
        if self.use_v2_model_runner:
            raise RuntimeError("RPT in vLLM runs on the V1 model runner: unset VLLM_USE_V2_MODEL_RUNNER")
        super().init_device()
        self.model_runner = RPTCPUModelRunner(self.vllm_config, torch.device("cpu"))
