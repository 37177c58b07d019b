"""The classes vLLM loads, without an engine: Model Runner V2's processor (its runner needs Triton,
so no engine here runs it) against the HF processor from scratch, and the class both runners load."""

from types import SimpleNamespace

import pytest
import torch

from rpt.integrations.lz_settings import LZSettings
from rpt.integrations.vllm import LZPenalty, LZPenaltyV1, LZPenaltyV2
from tests.integrations.test_lz_slots import truth  # the HF processor from scratch

pytestmark = pytest.mark.vllm
V = 50


def params(settings):
    if settings is None:
        return SimpleNamespace(extra_args=None)
    return SimpleNamespace(extra_args={"lz_penalty": settings.alpha, "lz_window": settings.window,
                                       "lz_buffer": settings.buffer, "lz_variant": settings.variant,
                                       "lz_include_prompt": settings.include_prompt})


REQUESTS = [  # (settings, prompt length, committed tokens, drafts fed this step)
    (LZSettings(0.7, 8, 3, "codelength", False), 5, 30, []),
    (None, 4, 20, []),
    (LZSettings(0.7, 8, 3, "codelength", False), 9, 12, [1, 2, 1]),  # speculative decoding: 4 rows
    (LZSettings(1.5, 12, 2, "closest_longest", True), 7, 25, [3]),
    (LZSettings(0.4, 64, 4, "codelength", True), 6, 9, []),  # a window longer than the context
]


def test_model_runner_v2_processor_equals_the_hf_processor_from_scratch():
    g = torch.Generator().manual_seed(0)
    slots = [3, 0, 5, 1, 4]  # slot of each request: the runner's free list, not the batch order
    history = torch.zeros(6, 64, dtype=torch.int32)
    prompt_len = torch.zeros(6, dtype=torch.int32)
    total_len = torch.zeros(6, dtype=torch.int32)
    for (_, plen, total, _), slot in zip(REQUESTS, slots):
        history[slot, :total] = torch.randint(0, 4, (total,), generator=g)  # few ids: long matches
        prompt_len[slot], total_len[slot] = plen, total
    req_states = SimpleNamespace(device=torch.device("cpu"), max_num_reqs=6, vocab_size=V,
                                 all_token_ids=SimpleNamespace(gpu=history), prompt_len=SimpleNamespace(gpu=prompt_len),
                                 total_len=SimpleNamespace(gpu=total_len))
    proc = LZPenalty(SimpleNamespace(), req_states)
    assert isinstance(proc, LZPenaltyV2)
    for (settings, *_), slot in zip(REQUESTS, slots):
        assert proc.add_request(slot, params(settings)) == (settings is not None)
    proc.apply_staged_writes()
    rows, local, input_ids, contexts = [], [], [], []
    for (settings, plen, total, drafts), slot in zip(REQUESTS, slots):
        committed = history[slot, :total].tolist()
        fed = [committed[-1]] + drafts  # local position 0 feeds the last committed token
        for k, token in enumerate(fed):
            rows.append(slot)
            local.append(k)
            input_ids.append(token)
            contexts.append((settings, committed + drafts[:k], plen))
    ctx = SimpleNamespace(expanded_idx_mapping=torch.tensor(rows, dtype=torch.int32), idx_mapping_np=torch.tensor(slots).numpy(),
                          expanded_local_pos=torch.tensor(local, dtype=torch.int32), input_ids=torch.tensor(input_ids, dtype=torch.int32))
    logits = torch.randn(len(rows), V, generator=g)
    got = proc.apply(logits.clone(), ctx)
    for r, (settings, context, plen) in enumerate(contexts):
        torch.testing.assert_close(got[r], truth(logits[r], settings, context, plen), rtol=0, atol=1e-6, msg=f"row {r}")
    assert torch.equal(got[contexts.index(next(c for c in contexts if c[0] is None))],
                       logits[[c[0] for c in contexts].index(None)])  # a request without LZ: bit for bit


def test_the_loaded_class_builds_what_each_runner_calls_for():
    from vllm.v1.sample.logits_processor import LogitsProcessor as V1
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2

    assert issubclass(LZPenalty, V1) and issubclass(LZPenalty, V2)  # both loaders' checks
    v1 = LZPenalty(SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=4)), torch.device("cpu"), False)
    assert isinstance(v1, LZPenaltyV1) and v1.is_argmax_invariant() is False
    with pytest.raises(ValueError, match="lz_buffer=0 is invalid"):
        LZPenalty.validate_params(SimpleNamespace(extra_args={"lz_penalty": 0.1, "lz_buffer": 0}))


def test_named_twice_in_one_engine_the_penalty_is_applied_once():
    """The entry point and a --logits-processors class path build it twice for one engine config."""
    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=2))
    first = LZPenalty(config, torch.device("cpu"), False)
    second = LZPenalty(config, torch.device("cpu"), False)
    assert isinstance(first, LZPenaltyV1) and not isinstance(second, LZPenaltyV1)
    added = [(0, params(REQUESTS[0][0]), [1, 2], [1, 2, 1, 2])]
    logits = torch.randn(1, V)
    out = logits.clone()
    for proc in (first, second):
        proc.update_state(SimpleNamespace(removed=[], added=added, moved=[]))
        out = proc.apply(out)
    torch.testing.assert_close(out[0], truth(logits[0], REQUESTS[0][0], [1, 2, 1, 2, 1, 2], 2))
    assert isinstance(LZPenalty(SimpleNamespace(scheduler_config=config.scheduler_config), "cpu", False), LZPenaltyV1)


def test_the_entry_point_is_installed():
    from importlib.metadata import entry_points

    found = [e.value for e in entry_points(group="vllm.logits_processors")]
    assert "rpt.integrations.vllm:LZPenalty" in found, "reinstall rpt (pip install -e .) to register the entry point"
