"""Two threads decoding with one model: each gets its own buffers, its tokens are the single-threaded ones,
and the model is left as they found it.

Overlap is forced, not hoped for: a streamer (called inside the decode, outside every compiled region)
holds the first thread inside its decode until the second is inside too, and the second until the first
has finished -- the order in which a save-and-restore toggle (the decode's old ``check_offsets``) is left
switched. Truths: the same decodes run one after the other, and the model's state read before."""

import sys
import threading
import time
from collections import Counter

import pytest
import torch

from rpt.decode_forward import llama_forward as decode_model
from rpt.decode_forward.compile_guard import dynamo_patch
from rpt.decode_forward.llama_forward import DecodeModel, release_fused_weights
from rpt.decode_forward.queries import _configs, attention_implementation, implementation_of
from rpt.sampling import SamplingConfig, generate
from rpt.sampling.decode.buffers import (
    DecodeBuffers,
    borrow,
    give_back,
    pooled_entries,
    release_decode_buffers,
)
from tests.sampling.decode.test_decoder import V, rpt_model

WAIT = 30  # seconds a thread waits for the other before the test fails (never reached when it passes)


class Gate:
    """A streamer whose first ``put`` (the prompt, once the decode runs) sets ``inside`` and waits for
    ``then``; it records what it receives."""

    def __init__(self, inside: threading.Event, then: threading.Event):
        self.inside, self.then, self.tokens, self.waited = inside, then, [], None

    def put(self, value):
        if not self.inside.is_set():
            self.inside.set()
            self.waited = self.then.wait(WAIT)
        self.tokens += value.reshape(-1).tolist()

    def end(self):
        pass


def overlapped(decode) -> dict:
    """``decode(name, streamer)`` in threads A and B, forced into the order A enters, B enters, A finishes,
    B finishes (each decode calls its streamer once it runs); their results by name. Fails on any
    thread's error, or where the two did not overlap so."""
    a_inside, b_inside, a_done = threading.Event(), threading.Event(), threading.Event()
    gates = {"A": Gate(a_inside, b_inside), "B": Gate(b_inside, a_done)}
    outs, errors = {}, []

    def run(name: str) -> None:
        try:
            if name == "B":
                assert a_inside.wait(WAIT)
            outs[name] = decode(name, gates[name])
        except BaseException as error:  # noqa: BLE001 -- reported by the main thread
            errors.append(error)
        finally:
            if name == "A":
                a_done.set()

    threads = [threading.Thread(target=run, args=(name,)) for name in ("A", "B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 3)
    assert not errors, errors
    assert gates["A"].waited and gates["B"].waited  # the decodes did overlap, in that order
    return outs


def state_of(model) -> dict:
    """What a decode must leave as it found it: the offset check, every config's attention implementation,
    dynamo's limits."""
    return {"check_offsets": model.check_offsets,
            "attention": [c._attn_implementation_internal for c in _configs(model)],
            "recompile_limit": torch._dynamo.config.recompile_limit,
            "fail_on_recompile_limit_hit": torch._dynamo.config.fail_on_recompile_limit_hit}


@pytest.mark.parametrize("compile", [False, pytest.param("eager", marks=pytest.mark.slow)])
def test_two_threads_decode_their_own_tokens_and_leave_the_model_as_it_was(compile, monkeypatch):
    """RPT with corrections on a ``flex_attention`` model running its own forward (its calls switch the
    attention to sdpa; a left-padded prompt, so that every call carries a mask and none runs flex's own
    kernel), eager and compiled: thread A enters its decode, B enters, A finishes, B finishes. Each gets
    the tokens of the same decode run alone; afterwards the offset check is on, the attention
    implementation is flex again, dynamo's limits are as before, and no pooled buffer is lent (compiled:
    A borrowed the bucket's entry, B, finding it lent, decoded on buffers of its own). The compiled case
    (3 s of tracing) is slow; ``test_no_two_threads_borrow_one_pooled_entry`` keeps the pool's guarantee
    in the default suite."""
    monkeypatch.setattr(decode_model, "ARCHITECTURES", {})  # the model's own forward: the attention switch runs
    model = rpt_model(2).float()
    model.lm.config._attn_implementation = "flex_attention"
    cfg = SamplingConfig(max_new_tokens=6, rpt_iters=1, confidence=0.3, eos_token_id=[])
    prompts = {name: torch.randint(0, V, (1, 5), generator=torch.Generator().manual_seed(seed))
               for name, seed in (("A", 1), ("B", 2))}
    mask = torch.tensor([[0, 1, 1, 1, 1]])
    alone = {name: generate(model, ids, cfg, mask, compile=compile).sequences for name, ids in prompts.items()}
    before = state_of(model)
    outs = overlapped(lambda name, streamer: generate(model, prompts[name], cfg, mask, compile=compile,
                                                      streamer=streamer).sequences)
    for name in ("A", "B"):
        assert torch.equal(outs[name], alone[name]), name
    assert state_of(model) == before and implementation_of(model) == "flex_attention"
    assert not any(entry.lent for entry in pooled_entries(model))
    release_decode_buffers(model)


def test_an_attention_switch_held_by_two_threads_is_restored_once_by_the_last():
    """A enters the switch (flex -> sdpa), B enters, A leaves, B leaves: the configs are flex again (each
    saving and restoring on its own, B would restore A's sdpa last), and sdpa while either is inside."""
    model = rpt_model(2).float()
    model.lm.config._attn_implementation = "flex_attention"
    a_inside, b_inside, a_left = threading.Event(), threading.Event(), threading.Event()
    seen = []

    def a():
        with attention_implementation(model, "sdpa"):
            a_inside.set()
            b_inside.wait(WAIT)
        a_left.set()

    def b():
        a_inside.wait(WAIT)
        with attention_implementation(model, "sdpa"):
            b_inside.set()
            a_left.wait(WAIT)
            seen.append(implementation_of(model))

    threads = [threading.Thread(target=f) for f in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 2)
    assert seen == ["sdpa"] and implementation_of(model) == "flex_attention"
    with dynamo_patch(recompile_limit=5):  # the decode's dynamo patches end where they began
        assert torch._dynamo.config.recompile_limit == 5
    assert torch._dynamo.config.recompile_limit != 5


@pytest.fixture
def fast_switching():
    """Python switches threads every microsecond (5 ms by default): races in a few lines' window happen."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


class Yielding(DecodeBuffers):
    """An entry whose ``lent`` flag lets another thread run when read, as any read may on a free-threaded
    Python (under CPython 3.11's GIL the check and the set happen to run without a switch between them)."""

    @property
    def lent(self):
        time.sleep(0)
        return self.__dict__.get("_lent", False)

    @lent.setter
    def lent(self, value):
        self.__dict__["_lent"] = value


def test_no_two_threads_borrow_one_pooled_entry(fast_switching):
    """Eight threads borrowing and giving back one bucket 300 times each: the pooled entry (its KV cache)
    is never held by two at once; the others get entries of their own."""
    owner = torch.nn.Module()
    holders, worst, lock = Counter(), [0], threading.Lock()
    start = threading.Barrier(8)

    def build():
        return Yielding(queries=type("Queries", (), {"calls": 0})(), state=None)

    def work():
        start.wait(WAIT)
        for _ in range(300):
            entry, is_pooled = borrow(owner, ("bucket",), build)
            with lock:
                holders[id(entry)] += 1
                worst[0] = max(worst[0], holders[id(entry)])
            time.sleep(0)  # held a moment (another thread runs): a second holder of one entry would be seen
            with lock:
                holders[id(entry)] -= 1
            give_back(entry)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert worst[0] == 1 and not any(e.lent for e in pooled_entries(owner))


def test_threads_stacking_a_fresh_models_weights_bind_them_once(fast_switching, monkeypatch):
    """Eight threads building the fused decode call of a fresh model at once (the check of the model's
    shape, before anything is stacked, waits until all eight are in it, or 20 ms: where they may all be,
    they all are): one stacks, the others find it done -- one set of groups shared by all, every group
    current, holding its parameters' values in storage of its own."""
    real, arrived, gave_up = decode_model.unsupported, threading.Condition(), []

    def gathering(lm, model=None):
        with arrived:
            gathering.count += 1
            arrived.notify_all()
            if not gave_up and not arrived.wait_for(lambda: gathering.count == 8, timeout=0.02):
                gave_up.append(True)  # the others are held elsewhere: a lock serialises them
        return real(lm, model)

    gathering.count = 0
    monkeypatch.setattr(decode_model, "unsupported", gathering)
    model = rpt_model(2).float()
    release_fused_weights(model.lm)
    start, made = threading.Barrier(8), []

    def build():
        start.wait(WAIT)
        made.append(DecodeModel.for_model(model))

    threads = [threading.Thread(target=build) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert len(made) == 8 and len({id(d.fused) for d in made}) == 1
    for layer in made[0].layers:
        for group in layer.groups:
            assert group.current()
            assert torch.equal(group.tensor, torch.cat(group.parameters()))
            for p in group.parameters():
                assert p.untyped_storage().data_ptr() != group.tensor.untyped_storage().data_ptr()


def test_custom_generate_in_two_threads_leaves_a_training_model_training():
    """``model.generate(custom_generate=...)`` decodes in eval mode and puts the model back: two threads'
    calls overlapping (A in, B in, A out, B out) on a model in training mode leave it in training mode
    (each restoring its own, B would restore A's eval mode last)."""
    from rpt.hf_generate import generate as custom_generate
    from tests.helpers.tiny_models import tiny_llama

    model = tiny_llama().train()
    overlapped(lambda name, streamer: custom_generate(model, torch.tensor([[3, 5, 7]]), max_new_tokens=3,
                                                      streamer=streamer))
    assert all(m.training for m in model.modules())
