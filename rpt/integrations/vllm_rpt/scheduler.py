"""``--scheduler-cls rpt.integrations.vllm_rpt.scheduler.RPTScheduler``: vLLM's V1 scheduler with the
two things RPT needs from it.

* **Admission.** Each request's RPT settings are checked against the checkpoint
  (:func:`~rpt.integrations.vllm_rpt.settings.parse_settings`: the trained window, the offset table,
  the ranges, what is not served). A refused request is never scheduled: it finishes at the next step
  with ``finish_reason="error"`` and the one-line message as its ``stop_reason``; every other request
  runs as if it had not come. An accepted one's ``max_tokens`` becomes its RPT budget, so vLLM's own
  length stop ends it where its driver ends.
* **A step that emits nothing** (the window filling, a correction round, the prefill that holds the
  first token): vLLM rolls back rejected drafts only when a step emitted a token, so the drafts would
  stay counted as computed. The request is set back to ``num_computed_tokens = num_tokens - 1``,
  where a step that emits leaves it: the next step re-feeds the last final token and the tail.

Async scheduling is off for the ``custom_class`` proposer (and on the CPU), so this extends the
synchronous ``Scheduler``.
"""

from __future__ import annotations

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason

from rpt.checkpoint.rpt_config import read_rpt_config
from rpt.integrations.vllm_rpt.internals import check_version
from rpt.integrations.vllm_rpt.settings import RPTSettingError, parse_settings, rpt_budget


class RPTScheduler(Scheduler):
    def __init__(self, *args, **kwargs) -> None:
        check_version()
        super().__init__(*args, **kwargs)
        model_config = self.vllm_config.model_config
        self.rpt_source = model_config.model
        lookup = {"revision": model_config.revision} if model_config.revision else {}
        config = read_rpt_config(self.rpt_source, **lookup)
        self.rpt_window = None if config is None else config.window
        # A constant "dynamic speculative decoding" table (the configured width at every batch size) turns
        # off the padding of a new one-token request with -1 drafts, which exists for CUDA graphs (this
        # engine is eager) and makes the stock sampler mis-sample a greedy request beside a sampled one.
        self.dynamic_sd_lookup = [self.num_spec_tokens] * (self.scheduler_config.max_num_seqs + 1)
        self.rpt_requests: set[str] = set()
        self.rpt_refused: list[tuple[object, str]] = []

    def add_request(self, request) -> None:
        params = request.sampling_params
        if params is not None and request.request_id not in self.requests:
            try:
                settings = parse_settings(params, self.rpt_window, self.rpt_source, params.max_tokens)
            except RPTSettingError as e:
                self.rpt_refused.append((request, str(e)))
                return
            if settings is not None:
                request.max_tokens = rpt_budget(request.num_prompt_tokens, params.max_tokens, self.max_model_len,
                                                settings.window)
                self.rpt_requests.add(request.request_id)
        super().add_request(request)

    def has_requests(self) -> bool:
        return bool(self.rpt_refused) or super().has_requests()

    def update_from_output(self, scheduler_output, model_runner_output):
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(req_id)
            if req_id in self.rpt_requests and request is not None and not request.is_finished() \
                    and request.num_computed_tokens >= request.num_tokens:
                request.num_computed_tokens = request.num_tokens - 1
        self.rpt_requests.intersection_update(self.requests)
        refused, self.rpt_refused = self.rpt_refused, []
        for request, message in refused:
            done = EngineCoreOutput(request_id=request.request_id, new_token_ids=[], finish_reason=FinishReason.ERROR,
                                    stop_reason=message)
            outputs.setdefault(request.client_index, EngineCoreOutputs()).outputs.append(done)
        return outputs
