"""The V1 model runner with RPT: each RPT request's rows are answered by its
:class:`~rpt.integrations.vllm_rpt.driver.RequestDriver`, whose next rows become the request's drafts.

* ``_sample``: the stock sampler runs for every request (RPT drafts cut to token ids first, so it
  never indexes past the vocabulary), then each RPT request's output row is replaced by the tokens its
  driver made final, ``-1`` elsewhere (vLLM's "nothing here"), from that request's logits rows. A
  partial prefill (``discard_request_mask``) is not stepped.
* ``propose_draft_token_ids``: the drivers' next rows (plain requests: none).
* ``_input_fits_in_drafter``: always True; the stock rule drops every request's drafts when one nears
  the context end, but each driver's budget already keeps its rows inside it
  (:func:`~rpt.integrations.vllm_rpt.settings.rpt_budget`).
* ``_update_states``: a driver lives until its request finishes, through preemption (the re-prefill's
  one row is the re-fed token of the planned block).
"""

from __future__ import annotations

import dataclasses

import torch
from vllm.v1.worker.cpu_model_runner import CPUModelRunner

from rpt.integrations.vllm_rpt.driver import RequestDriver
from rpt.integrations.vllm_rpt.settings import RPTSettingError, parse_settings, rpt_budget


def stop_ids(params) -> list[int]:
    """The ids that end a request in vLLM's own stop check (EOS unless ignored, and stop_token_ids)."""
    ids = set(params.stop_token_ids or ())
    if params.eos_token_id is not None:
        ids.add(params.eos_token_id)
    return sorted(ids)


class RPTRunnerMixin:
    """The RPT overrides of a V1 model runner (``GPUModelRunner`` or a subclass of it)."""

    def _rpt_driver(self, req_id: str) -> RequestDriver | None:
        drivers: dict[str, RequestDriver | None] = self.__dict__.setdefault("rpt_drivers", {})
        if req_id not in drivers:
            state = self.requests[req_id]
            params = state.sampling_params
            window = getattr(self.get_model(), "rpt_window", None)
            try:
                settings = parse_settings(params, window, self.model_config.model, params.max_tokens)
            except RPTSettingError:
                settings = None  # the scheduler refused it at admission: it never reaches a step
            if settings is None:
                drivers[req_id] = None
            else:
                prompt = list(state.prompt_token_ids)
                budget = rpt_budget(len(prompt), params.max_tokens, self.max_model_len, settings.window)
                drivers[req_id] = RequestDriver(prompt, settings, budget, stop_ids(params))
        return drivers[req_id]

    def _update_states(self, scheduler_output):
        drivers = self.__dict__.setdefault("rpt_drivers", {})
        for req_id in scheduler_output.finished_req_ids:
            drivers.pop(req_id, None)
        return super()._update_states(scheduler_output)

    def _sample(self, logits, spec_decode_metadata):
        req_ids = list(self.input_batch.req_ids)
        rpt = [(i, d) for i, req_id in enumerate(req_ids) if (d := self._rpt_driver(req_id)) is not None]
        if not rpt:
            return super()._sample(logits, spec_decode_metadata)
        vocab = self.input_batch.vocab_size
        if spec_decode_metadata is None:
            ends = list(range(1, len(req_ids) + 1))  # one row per request
        else:
            ends = spec_decode_metadata.cu_num_sampled_tokens.tolist()
        # the stock sampler may edit logits in place: the RPT rows are taken first
        rows = {i: logits[(ends[i - 1] if i else 0): ends[i]].clone() for i, _ in rpt}
        stock = spec_decode_metadata
        if stock is not None:  # chain codes cut to token ids; vLLM's -1 padding drafts stay -1 (never accepted)
            ids = stock.draft_token_ids
            stock = dataclasses.replace(stock, draft_token_ids=torch.where(ids >= vocab, ids % vocab, ids))
        out = super()._sample(logits, stock)
        emitted = {i: ([] if self.discard_request_mask.np[i] else driver.step(rows[i])) for i, driver in rpt}
        sampled = out.sampled_token_ids
        width = max([2, sampled.shape[1]] + [len(tokens) for tokens in emitted.values()])
        # width >= 2: vLLM parses the rows as speculative output, where -1 means "no token here"
        merged = torch.full((sampled.shape[0], width), -1, dtype=sampled.dtype, device=sampled.device)
        merged[:, : sampled.shape[1]] = sampled
        for i, tokens in emitted.items():
            merged[i] = -1
            merged[i, : len(tokens)] = torch.tensor(tokens, dtype=sampled.dtype)
        out.sampled_token_ids = merged
        return out

    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, *args, **kwargs):
        vocab = self.input_batch.vocab_size
        drafts = []
        for req_id in self.input_batch.req_ids:
            driver = self._rpt_driver(req_id)
            drafts.append([] if driver is None else driver.drafts(vocab))
        return drafts

    def _input_fits_in_drafter(self, common_attn_metadata) -> bool:
        return common_attn_metadata is not None


class RPTCPUModelRunner(RPTRunnerMixin, CPUModelRunner):
    """vLLM's CPU model runner with RPT."""
