"""The pool of compiled decodes' buffers (``rpt/sampling/decode/buffers.py``): one entry lent per bucket,
the least recently used dropped beyond two, a lent entry never shared, everything freed with the model."""

import gc
import weakref

import pytest
import torch

from rpt.sampling import SamplingConfig, generate
from rpt.sampling.decode.buffers import (
    POOLED_PER_MODEL,
    DecodeBuffers,
    borrow,
    give_back,
    pooled,
    pooled_entries,
    release_decode_buffers,
)
from tests.sampling.decode.test_decoder import prompts, rpt_model


class Model(torch.nn.Module):
    pass


def build(made: list):
    def make():
        made.append(DecodeBuffers(queries=type("Q", (), {"calls": 5})(), state=None))
        return made[-1]
    return make


def test_one_entry_per_bucket_lent_once_least_recent_dropped():
    model, made = Model(), []
    a, pooled_a = borrow(model, ("a",), build(made))
    assert pooled_a and a.lent and a.queries.calls == 0  # the call count starts anew per decode
    b, pooled_b = borrow(model, ("a",), build(made))  # lent out: a fresh entry the caller owns
    assert not pooled_b and b is not a and pooled(model) == [("a",)]
    give_back(a)
    again, _ = borrow(model, ("a",), build(made))
    assert again is a and len(made) == 2
    give_back(a)
    borrow(model, ("b",), build(made))[0].lent = False
    borrow(model, ("a",), build(made))[0].lent = False  # "a" most recent now
    borrow(model, ("c",), build(made))
    assert POOLED_PER_MODEL == 2 and pooled(model) == [("a",), ("c",)]  # "b" dropped
    release_decode_buffers(model)
    assert pooled(model) == []


def test_a_lent_entry_is_not_dropped():
    model, made = Model(), []
    first, _ = borrow(model, ("a",), build(made))  # a decode still runs on it
    for key in ("b", "c", "d"):
        give_back(borrow(model, (key,), build(made))[0])
    assert ("a",) in pooled(model) and first.lent


def test_the_pool_goes_with_the_model():
    """A compiled decode pools its buffers on the model; once the model is unreachable, they are freed."""
    model = rpt_model(2).float()
    ids, mask = prompts(2)
    generate(model, ids, SamplingConfig(max_new_tokens=3, eos_token_id=[]), attention_mask=mask, compile="eager")
    assert len(pooled(model)) == 1
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None


@pytest.mark.parametrize("fused", [True, False])
def test_a_short_prompt_allocates_the_cache_eagerly_and_static(monkeypatch, fused):
    """A prompt of at most 8 tokens is prefilled through the compiled model call; the KV is allocated
    outside any graph and marked static (what the graph-replayed steps need: a cache allocated inside a
    compiled call would not be): by the fused decode call before its first call, which then compiles (a
    Llama), or by the cache's first call run eagerly (the model's own forward: the second decode traces
    the prefill's graph); after that, nothing is traced."""
    from torch._dynamo.utils import counters

    from rpt.decode_forward import llama_forward as decode_model

    if not fused:
        monkeypatch.setattr(decode_model, "ARCHITECTURES", {})
    torch._dynamo.reset()
    counters.clear()
    model = rpt_model(2).float()
    cfg = SamplingConfig(max_new_tokens=4, eos_token_id=[])
    graphs = []
    for seed in (1, 2, 3):
        ids = torch.randint(0, 97, (2, 4), generator=torch.Generator().manual_seed(seed))
        assert torch.equal(generate(model, ids, cfg, compile="eager").sequences, generate(model, ids, cfg).sequences)
        graphs.append(counters["stats"]["unique_graphs"])
    (entry,) = pooled_entries(model)
    for layer in entry.queries.cache.layers:
        for kv in (layer.keys, layer.values):
            assert getattr(kv, "_dynamo_static_input_type", None) is not None
    # the step's and the prefill's (the model's own forward: the prefill's over the allocated cache); none
    assert graphs == ([2, 2, 2] if fused else [1, 2, 2]), graphs
