"""Model Runner V2's LZ state (rpt/integrations/lz_slots.py) without vLLM: against the HF processor
from scratch on each request's context (one row per request, and speculative decoding's several),
and bounded by the runner's slots whatever the traffic."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rpt.integrations.lz_settings import LZSettings
from rpt.integrations.lz_slots import LZSlots
from rpt.sampling.lz.processor import LZPenaltyLogitsProcessor

V = 50
REQUESTS = [  # (settings, prompt length, committed tokens, drafts fed this step)
    (LZSettings(0.7, 8, 3, "codelength", False), 5, 30, [1, 2, 1]),  # speculative decoding: 4 rows
    (None, 4, 20, []),
    (LZSettings(0.7, 8, 3, "codelength", False), 9, 12, []),
    (LZSettings(1.5, 12, 2, "closest_longest", True), 7, 25, [3]),
    (LZSettings(0.4, 64, 4, "codelength", True), 6, 9, []),  # a window longer than the context
]


def truth(logits_row, settings, context, prompt_len):
    if settings is None:
        return logits_row
    proc = LZPenaltyLogitsProcessor(settings.alpha, settings.window, settings.buffer,
                                    prompt_length=0 if settings.include_prompt else prompt_len, variant=settings.variant)
    return proc(torch.tensor([context]), logits_row[None].clone())[0]


def req_states(max_reqs: int, width: int = 64):
    return SimpleNamespace(device=torch.device("cpu"), max_num_reqs=max_reqs, vocab_size=V,
                           all_token_ids=SimpleNamespace(gpu=torch.zeros(max_reqs, width, dtype=torch.int32)),
                           prompt_len=SimpleNamespace(gpu=torch.zeros(max_reqs, dtype=torch.int32)),
                           total_len=SimpleNamespace(gpu=torch.zeros(max_reqs, dtype=torch.int32)))


@pytest.mark.parametrize("drafts", [False, True], ids=["one-row-per-request", "speculative"])
def test_model_runner_v2_state_equals_the_hf_processor_from_scratch(drafts):
    g = torch.Generator().manual_seed(0)
    slots = [3, 0, 5, 1, 4]  # slot of each request: the runner's free list, not the batch order
    rs = req_states(6)
    for (_, plen, total, _), slot in zip(REQUESTS, slots):
        rs.all_token_ids.gpu[slot, :total] = torch.randint(0, 4, (total,), generator=g)  # few ids: long matches
        rs.prompt_len.gpu[slot], rs.total_len.gpu[slot] = plen, total
    state = LZSlots(rs)
    for (settings, *_), slot in zip(REQUESTS, slots):
        assert state.add(slot, settings) == (settings is not None)
    state.apply_staged_writes()
    rows, local, input_ids, contexts = [], [], [], []
    for (settings, plen, total, fed_drafts), slot in zip(REQUESTS, slots):
        committed = rs.all_token_ids.gpu[slot, :total].tolist()
        fed_drafts = fed_drafts if drafts else []
        for k, token in enumerate([committed[-1], *fed_drafts]):  # local position 0 feeds the last committed token
            rows.append(slot)
            local.append(k)
            input_ids.append(token)
            contexts.append((settings, committed + fed_drafts[:k], plen))
    ctx = SimpleNamespace(expanded_idx_mapping=torch.tensor(rows, dtype=torch.int32),
                          idx_mapping_np=np.array(slots, dtype=np.int32),
                          expanded_local_pos=torch.tensor(local, dtype=torch.int32),
                          input_ids=torch.tensor(input_ids, dtype=torch.int32))
    logits = torch.randn(len(rows), V, generator=g)
    for _ in range(2):  # the second step reuses the row index of the first
        got = state.apply(logits.clone(), ctx)
        for r, (settings, context, plen) in enumerate(contexts):
            torch.testing.assert_close(got[r], truth(logits[r], settings, context, plen), rtol=0, atol=1e-6)
        plain = [c[0] for c in contexts].index(None)
        assert torch.equal(got[plain], logits[plain])  # a request without LZ: bit for bit


def test_settings_live_as_long_as_a_slot_holds_them():
    """Before: every distinct setting ever seen kept a group (a list searched per request) and a table."""
    state = LZSlots(req_states(4))
    ctx = SimpleNamespace(expanded_idx_mapping=torch.tensor([0, 1]), idx_mapping_np=np.array([0, 1], dtype=np.int32),
                          expanded_local_pos=torch.zeros(2, dtype=torch.int32), input_ids=torch.zeros(2, dtype=torch.int32))
    for request in range(200):  # 200 distinct settings through 2 slots
        state.add(request % 2, LZSettings(0.01 + request * 1e-3, 16, 4, "codelength", True))
        state.apply_staged_writes()
        state.apply(torch.randn(2, V), ctx)
        assert len(state.groups) <= 2 and max(g.gid for g in state.groups.values()) < 4
    assert state.state_bytes() <= 2 * (4 * 5 * 16 + 4 * 16)  # two live settings' tables
    state.add(0, None)
    state.add(1, None)
    assert state.groups == {} and state.state_bytes() == 0
