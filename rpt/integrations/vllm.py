"""The LZ penalty as a vLLM logits processor (this module imports vLLM; nothing else in ``rpt`` does).

    vllm serve CKPT --logits-processors rpt.integrations.vllm:LZPenalty     # or: installed rpt registers it
    llm = LLM(CKPT, logits_processors=[LZPenalty])
    llm.generate(prompts, SamplingParams(temperature=0, extra_args={"lz_penalty": 0.15, "lz_window": 512}))

Per request, ``SamplingParams.extra_args`` takes :class:`~rpt.sampling.config.SamplingConfig`'s
names (``lz_penalty``, ``lz_window``, ``lz_buffer``, ``lz_variant``, ``lz_include_prompt``;
:mod:`rpt.integrations.lz_settings`), checked at admission; a request without ``lz_penalty`` is
untouched. The penalty is :mod:`rpt.sampling.lz.definition`'s, so the tokens equal ``rpt.sampling.generate``'s.

vLLM has two processor interfaces: V1's model runner (CPU builds, and GPU ones without Triton or
with ``VLLM_USE_V2_MODEL_RUNNER=0``) and Model Runner V2 (the GPU default since it exists). Both
load the ``vllm.logits_processors`` entry point and a ``--logits-processors`` class path; V2
refuses a class that is not its own subclass, V1 instantiates whatever it is given. So
:class:`LZPenalty` subclasses both and builds the implementation the calling runner needs:
:class:`LZPenaltyV1` (per-row device windows updated from the appended token,
:mod:`rpt.integrations.lz_rows`) or :class:`LZPenaltyV2` (the windows gathered every step from
the runner's own device token history; no host work per step beyond grouping).
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality
from vllm.v1.sample.logits_processor import LogitsProcessor as V1LogitsProcessor

from rpt.integrations.lz_rows import LZRows
from rpt.integrations.lz_settings import LZSettings
from rpt.integrations.lz_slots import LZSlots
from rpt.integrations.vllm_rpt import admission

try:  # Model Runner V2's interface (vLLM >= 0.3x); older releases have V1 only
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2LogitsProcessor
except ImportError:  # pragma: no cover - depends on the installed vLLM
    V2LogitsProcessor = None


def _validate(sampling_params) -> None:
    """Every rpt setting checked at admission: the LZ penalty's, and RPT's (:mod:`rpt.integrations.vllm_rpt.admission`)."""
    LZSettings.from_extra_args(sampling_params.extra_args)
    admission.validate(sampling_params)


class LZPenaltyV1(V1LogitsProcessor):
    """V1 interface: ``update_state`` follows the batch's rows, ``apply`` penalises the LZ rows."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self.state = LZRows(vllm_config.scheduler_config.max_num_seqs, device)

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        _validate(sampling_params)

    def is_argmax_invariant(self) -> bool:
        return False  # it changes which token is largest: greedy requests need it too

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return  # the new tokens themselves are read in apply(), after async placeholders are filled
        for row in batch_update.removed:
            self.state.remove(row)
        for row, params, prompt, output in batch_update.added:
            self.state.add(row, LZSettings.from_extra_args(params.extra_args), prompt, output)
        for a, b, direction in batch_update.moved:
            if direction == MoveDirectionality.SWAP:
                self.state.swap(a, b)
            else:
                self.state.move(a, b)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.state.active:
            return logits
        return self.state.apply(logits)


class LZPenaltyV2(*([V2LogitsProcessor] if V2LogitsProcessor else [])):
    """Model Runner V2 interface: per-slot settings from ``add_request``; each step, each LZ row's last
    W context tokens are gathered from ``req_states.all_token_ids`` (committed tokens) and the
    step's ``input_ids`` (draft tokens under speculative decoding), then the match lengths are
    computed from scratch on the device (:func:`~rpt.sampling.lz.definition.lz_match_lengths`, no host sync).
    The state and the step are :class:`~rpt.integrations.lz_slots.LZSlots` (no vLLM import)."""

    def __init__(self, vllm_config, req_states) -> None:
        self.state = LZSlots(req_states)

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        _validate(sampling_params)

    def add_request(self, req_idx: int, sampling_params) -> bool:
        return self.state.add(req_idx, LZSettings.from_extra_args(sampling_params.extra_args))

    def apply_staged_writes(self) -> None:
        self.state.apply_staged_writes()

    def apply(self, logits: torch.Tensor, ctx) -> torch.Tensor:
        return self.state.apply(logits, ctx)


class _SecondV1(V1LogitsProcessor):
    """A second LZ processor in one engine: does nothing, so the penalty is applied once."""

    def __init__(self, *args) -> None:
        pass

    def is_argmax_invariant(self) -> bool:
        return True  # vLLM skips it for greedy requests

    def update_state(self, batch_update) -> None:
        pass

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits


class _SecondV2(*([V2LogitsProcessor] if V2LogitsProcessor else [])):
    def add_request(self, req_idx: int, sampling_params) -> bool:
        return False

    def apply(self, logits: torch.Tensor, ctx) -> torch.Tensor:
        return logits


_BUILT: dict[tuple[int, bool], object] = {}  # (id of the engine's config, V2?) -> that config


class LZPenalty(*([V1LogitsProcessor] + ([V2LogitsProcessor] if V2LogitsProcessor else []))):
    """What vLLM loads (entry point or class path): an :class:`LZPenaltyV1` when the V1 runner builds it
    (``vllm_config, device, is_pin_memory``), an :class:`LZPenaltyV2` when Model Runner V2 does
    (``vllm_config, req_states``)."""

    def __new__(cls, vllm_config, *args):
        v2 = len(args) == 1
        key = (id(vllm_config), v2)
        if _BUILT.get(key) is vllm_config:
            # installed rpt's entry point and a --logits-processors class path both name it: one engine,
            # one penalty (the identity check, not the id alone, since ids are reused)
            return _SecondV2() if v2 else _SecondV1()
        _BUILT[key] = vllm_config
        # Returning an instance of another class skips LZPenalty.__init__: the one built is complete.
        return LZPenaltyV2(vllm_config, *args) if v2 else LZPenaltyV1(vllm_config, *args)

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        _validate(sampling_params)
