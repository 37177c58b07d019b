"""The ``custom_class`` speculative proposer vLLM builds for RPT: it only switches the engine's draft
plumbing on (draft rows scheduled, logits for every row, drafts fed back each step). The drafts
themselves come from the requests' drivers (:meth:`RPTRunnerMixin.propose_draft_token_ids
<rpt.integrations.vllm_rpt.runner.RPTRunnerMixin.propose_draft_token_ids>`), never from here."""

from __future__ import annotations


class Drafts:
    def __init__(self, vllm_config) -> None:
        self.vllm_config = vllm_config

    def load_model(self, *args, **kwargs) -> None:
        pass

    def propose(self, sampled_token_ids, *args, **kwargs) -> list[list[int]]:
        return [[] for _ in sampled_token_ids]  # the runner answers for the drivers before this is reached
