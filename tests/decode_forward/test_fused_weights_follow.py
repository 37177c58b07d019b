"""The decode's stacked weight copies follow every way a user changes a model, and never touch the user's
tensors (``rpt/decode_forward/fused_weights.py``, ``rpt/decode_forward/llama_forward.py``).

Truth: a freshly built model (another object, built from scratch) given the changed model's weights and
attributes, decoded; and Hugging Face's own forward (``generate_reference``) where a hook must run. Each
change is checked to move the tokens, so that a decode ignoring it would fail. Float32; eager decodes here,
compiled ones (dynamo's ``eager`` backend: the trace and guards inductor gets) at the end.
"""

import pytest
import torch
from torch import nn

from rpt.decode_forward.queries import ModelQueries, Visibility
from rpt.sampling import SamplingConfig, generate, generate_reference
from tests.decode_forward.test_fused_decode import CHAIN_LIMIT, PADS, N, V, block, hf_truth, tiny

CFG = SamplingConfig(max_new_tokens=8, eos_token_id=[], rpt_iters=1, rpt_window=3, confidence=0.5)
IDS = torch.randint(0, V, (2, 6), generator=torch.Generator().manual_seed(21))


def tokens(model, compile=False) -> torch.Tensor:
    return generate(model, IDS, CFG, compile=compile).sequences


def fresh(model, edit=None):
    """A model built anew (another seed: other initial weights) holding ``model``'s weights, then ``edit``."""
    other = tiny(layers=model.lm.config.num_hidden_layers, seed=99, dtype=model.dtype)
    other.load_state_dict({k: v.detach().clone() for k, v in model.state_dict().items()})
    if edit is not None:
        edit(other)
    return other


def snapshot(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same_values(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def other_weights(model, seed: int = 5) -> dict:
    """A state of ``model``'s keys with the q/k/v and gate/up weights (the stacked ones) redrawn."""
    g = torch.Generator().manual_seed(seed)
    return {k: (torch.randn(v.shape, generator=g, dtype=v.dtype) * 0.4 if any(
        n in k for n in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")) else v.detach().clone())
        for k, v in model.state_dict().items()}


def proj(model, layer: int, name: str) -> nn.Linear:
    block = model.lm.model.layers[layer]
    return getattr(block.self_attn if name in ("q_proj", "k_proj", "v_proj", "o_proj") else block.mlp, name)


# ---- the user's tensors ---------------------------------------------------------------------------------
def test_a_decode_leaves_every_parameter_and_its_storage_as_it_was():
    """After a decode no parameter has other storage or other values, and none shares storage with another
    (what accelerate's ``save_state`` needs)."""
    model = tiny()
    before = {n: (p.data_ptr(), p.untyped_storage().nbytes()) for n, p in model.named_parameters()}
    values = snapshot(model)
    tokens(model)
    assert {n: (p.data_ptr(), p.untyped_storage().nbytes()) for n, p in model.named_parameters()} == before
    assert same_values(snapshot(model), values)
    assert all(p.untyped_storage().nbytes() == p.numel() * p.element_size() for p in model.parameters())


def test_load_state_dict_assign_and_back_leaves_the_snapshot_intact():
    """The seen case: ``sd = model.state_dict()``, ``load_state_dict(other, assign=True)``, decode: ``sd``
    keeps its values (nothing wrote into it), the decode follows ``other``, and restoring ``sd`` gives the
    first tokens back."""
    model = tiny()
    first = tokens(model)
    sd = model.state_dict()
    kept = snapshot(model)
    other = other_weights(model)
    model.load_state_dict(other, assign=True)
    second = tokens(model)
    assert torch.equal(second, tokens(fresh(model))) and not torch.equal(second, first)
    assert same_values({k: v.detach() for k, v in sd.items()}, kept)
    model.load_state_dict(sd, assign=True)
    assert torch.equal(tokens(model), first)


def test_an_ema_swap_through_data_leaves_the_backup_intact():
    """``p.data = shadow``, decode, ``p.data = backup``: the backup keeps its values and the restored model
    decodes its first tokens; the shadow is not written either."""
    model = tiny()
    first = tokens(model)
    params = [p for n, p in model.named_parameters() if "proj" in n]
    backup = [p.data for p in params]
    backup_values = [b.clone() for b in backup]
    g = torch.Generator().manual_seed(3)
    shadow = [p.data + 0.3 * torch.randn(p.shape, generator=g) for p in params]
    shadow_values = [s.clone() for s in shadow]
    for p, s in zip(params, shadow):
        p.data = s
    swapped = tokens(model)
    assert torch.equal(swapped, tokens(fresh(model))) and not torch.equal(swapped, first)
    for p, b in zip(params, backup):
        p.data = b
    assert torch.equal(tokens(model), first)
    assert all(torch.equal(b, v) for b, v in zip(backup, backup_values))
    assert all(torch.equal(s, v) for s, v in zip(shadow, shadow_values))


# ---- every way a model changes, against a fresh model ------------------------------------------------------
def load_copy(m):
    m.load_state_dict(other_weights(m))


def data_in_place(m):  # torch_ema's copy_to, PEFT's unsafe merge: writes no version counter of the parameter sees
    for name in ("k_proj", "up_proj"):
        p = proj(m, 1, name).weight
        p.data.copy_(p.data * -1.7 + 0.05)


def optimizer_step(m):
    params = [p for n, p in m.named_parameters() if "layers" in n]
    opt = torch.optim.SGD(params, lr=0.5)
    for p in params:
        p.grad = torch.ones_like(p) * 0.1
    opt.step()


def replace_head(m):
    g = torch.Generator().manual_seed(8)
    head = nn.Linear(32, V, bias=False)
    head.weight.data = torch.randn(V, 32, generator=g) * 0.4
    m.lm.lm_head = head


def replace_norm(m):
    norm = type(m.lm.model.norm)(32, eps=1e-6)
    norm.weight.data = torch.linspace(0.2, 2.0, 32)
    m.lm.model.norm = norm


def replace_projection(m):
    g = torch.Generator().manual_seed(9)
    old = proj(m, 0, "v_proj")
    new = nn.Linear(old.in_features, old.out_features, bias=False)
    new.weight.data = torch.randn(new.weight.shape, generator=g) * 0.4
    m.lm.model.layers[0].self_attn.v_proj = new


def tie(m):
    m.lm.lm_head.weight = m.lm.model.embed_tokens.weight


def scaling(m):
    for layer in m.lm.model.layers:
        layer.self_attn.scaling = layer.self_attn.scaling * 3.0


def to_float64(m):
    m.to(torch.float64)


CHANGES = {"load_state_dict": load_copy, "in place through .data": data_in_place, "optimizer step": optimizer_step,
           "lm_head replaced": replace_head, "final norm replaced": replace_norm,
           "a projection replaced": replace_projection, "tie_weights": tie, "attention scaling": scaling,
           ".to(float64)": to_float64}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_after_a_decode_is_followed_by_the_next(change):
    """Each change after a fused decode: the next decode's tokens are those of a freshly built model given the
    changed model's weights (and the same attribute or module change); they differ from the first decode's
    (the change matters), except ``.to(float64)``, which keeps the values."""
    model = tiny()
    first = tokens(model)
    edit = CHANGES[change]
    edit(model)
    structural = change in ("lm_head replaced", "final norm replaced", "a projection replaced", "tie_weights",
                            "attention scaling")
    # a module or attribute change is made to the fresh model too (a state_dict carries no attribute)
    truth = fresh(model, edit if structural else None)
    got = tokens(model)
    assert torch.equal(got, tokens(truth))
    assert torch.equal(got, first) == (change == ".to(float64)")
    if change == ".to(float64)":
        model.float()
        assert torch.equal(tokens(model), first)


def test_peft_merge_after_a_decode_is_followed():
    """A decode, then a LoRA adapter (random, nonzero) injected by PEFT and merged and unloaded (PEFT adds the
    delta with ``weight.data += ...``, unseen by any version counter): the next decode follows the merged
    weights, as a fresh model given them does."""
    from peft import LoraConfig, get_peft_model

    model = tiny()
    first = tokens(model)
    targets = ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"]
    peft_model = get_peft_model(model.lm, LoraConfig(r=4, target_modules=targets, init_lora_weights=False))
    model.lm = peft_model.merge_and_unload()
    got = tokens(model)
    assert torch.equal(got, tokens(fresh(model))) and not torch.equal(got, first)


HOOKS = {
    "on the model, before": lambda m: m.register_forward_hook(lambda mod, args, out: None),
    "on an MLP, after": lambda m: m.lm.model.layers[1].mlp.register_forward_hook(lambda mod, args, out: out * 3),
    "pre-hook on a layer": lambda m: m.lm.model.layers[0].register_forward_pre_hook(
        lambda mod, args: (args[0] * 0.5, *args[1:])),
    "global": lambda m: torch.nn.modules.module.register_module_forward_hook(
        lambda mod, args, out: out * 1.5 if type(mod).__name__ == "LlamaMLP" else None),
}


@pytest.mark.parametrize("where", list(HOOKS))
def test_a_forward_hook_is_run(where):
    """A forward hook (or pre-hook) on the RPT model itself, on a submodule the fused call bypasses, or a
    global one, registered after a fused decode: the next decode runs Hugging Face's forward (the hook is
    called) and gives its tokens (``generate_reference``); removed, the fused call is back."""
    model = tiny()
    first = tokens(model)
    calls = []
    handle = HOOKS[where](model)
    counting = model.lm.model.norm.register_forward_hook(lambda mod, args, out: calls.append(1))
    try:
        got = tokens(model)
        assert calls, "the hooks were not run"
        assert torch.equal(got, generate_reference(model, IDS, CFG).sequences)
        assert torch.equal(got, first) == (where == "on the model, before")  # that hook changes nothing
    finally:
        handle.remove()
        counting.remove()
    assert torch.equal(tokens(model), first)


# ---- compiled calls and decodes ---------------------------------------------------------------------------
NTP = SamplingConfig(max_new_tokens=4, eos_token_id=[])


def compiled_call(queries, ids, positions, offsets):
    """One compiled model call of 15 queries (a ragged prefill with a PTP chain: query bucket 16)."""
    limit = torch.cat([torch.arange(N + 1), torch.tensor([CHAIN_LIMIT, CHAIN_LIMIT])])
    since = torch.cat([torch.arange(N + 1), torch.tensor([N + 1, N + 1])])
    with torch.no_grad():
        return queries(ids, positions, torch.arange(N + 3), Visibility(limit, PADS, since), kv_len=N + 3,
                       offsets=offsets)


def test_compiled_calls_follow_a_replaced_module_an_attribute_and_a_hook():
    """A compiled model call (dynamo's eager backend: inductor's trace and guards), then a weight written in
    place, then the head replaced and
    the attention scaling changed (each alone moves the logits), then a hook added, then another (to the
    model's own forward, compiled by then): each call equals Hugging Face's forward of the model as it is,
    with the mask written by hand, and the hooks run. (Whole compiled
    decodes over more changes: test_compiled_decodes_follow_every_kind_of_change, slow.)"""
    torch._dynamo.reset()
    model = tiny(layers=1)
    queries = ModelQueries(model, 64, compile=True, compile_backend="eager")
    ids, positions, offsets, allowed = block()
    first = compiled_call(queries, ids, positions, offsets)
    torch.testing.assert_close(first, hf_truth(model, ids, positions, offsets, allowed), atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # an in-place write (an optimizer step's kind): the same graph reads the refilled copy
        proj(model, 0, "k_proj").weight.mul_(-1.5)
    stepped = compiled_call(queries, ids, positions, offsets)
    torch.testing.assert_close(stepped, hf_truth(model, ids, positions, offsets, allowed), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(stepped, first, atol=1e-3)
    first = stepped
    for edit in (replace_head, scaling):  # each change alone moves the logits: a stale one would show
        alone = fresh(model, edit)
        assert not torch.allclose(hf_truth(alone, ids, positions, offsets, allowed), first, atol=1e-3)
    replace_head(model)
    scaling(model)
    got = compiled_call(queries, ids, positions, offsets)
    torch.testing.assert_close(got, hf_truth(model, ids, positions, offsets, allowed), atol=1e-5, rtol=1e-5)
    calls = []
    model.lm.model.layers[0].mlp.register_forward_hook(lambda mod, args, out: calls.append(1) or out * 2)
    hooked = compiled_call(queries, ids, positions, offsets)
    assert calls
    calls.clear()
    torch.testing.assert_close(hooked, hf_truth(model, ids, positions, offsets, allowed), atol=1e-5, rtol=1e-5)
    assert calls and not torch.allclose(hooked, got, atol=1e-3)
    # a second hook, added after the model's own forward was compiled (dynamo skips hook guards by default)
    model.lm.lm_head.register_forward_pre_hook(lambda mod, args: (args[0] * 0.25,))
    twice = compiled_call(queries, ids, positions, offsets)
    torch.testing.assert_close(twice, hf_truth(model, ids, positions, offsets, allowed), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(twice, hooked, atol=1e-3)


@pytest.mark.slow
def test_compiled_decodes_follow_every_kind_of_change():
    """Compiled NTP decodes after the head is replaced and after the scaling changed, then compiled RPT decodes (k = 1, corrections) between changes: the head replaced, the scaling changed,
    weights given new storage (``load_state_dict(assign=True)``), written through ``.data``, a hook added:
    each equals a fresh model's eager decode. (734 s at load 12, 2 cores; the default-suite test of the
    guarantee: test_compiled_decodes_follow_a_replaced_module_an_attribute_and_a_hook.)"""
    torch._dynamo.reset()
    ntp = tiny(layers=1)
    first = generate(ntp, IDS, NTP, compile="eager").sequences
    for edit in (replace_head, scaling):
        edit(ntp)
        truth = fresh(ntp, edit if edit is replace_head else lambda m: (replace_head(m), scaling(m)))
        got = generate(ntp, IDS, NTP, compile="eager").sequences
        assert torch.equal(got, generate(truth, IDS, NTP).sequences) and not torch.equal(got, first)
        first = got
    model = tiny()
    assert torch.equal(tokens(model, "eager"), tokens(model))
    for edit in (replace_head, scaling):
        edit(model)
        assert torch.equal(tokens(model, "eager"), tokens(fresh(model, edit)))
    model.load_state_dict(other_weights(model, seed=11), assign=True)
    data_in_place(model)
    truth = fresh(model, lambda m: (replace_head(m), scaling(m)))
    assert torch.equal(tokens(model, "eager"), tokens(truth))
    calls = []
    model.lm.model.layers[0].mlp.register_forward_hook(lambda mod, args, out: calls.append(1) or out * 2)
    truth.lm.model.layers[0].mlp.register_forward_hook(lambda mod, args, out: out * 2)
    assert torch.equal(tokens(model, "eager"), tokens(truth)) and calls


@pytest.mark.slow
def test_compiled_decodes_of_a_model_without_the_fused_call_follow_a_replaced_head_and_a_hook():
    """A model the fused call does not take (GPT-2: its own forward, compiled): its head replaced between
    compiled decodes, then a hook added: each compiled decode equals the eager decode of the model as it
    is (dynamo's guards on the modules, and on their hooks, which the decode switches on). (172 s at
    load 12; the default-suite test of the guarantee for the fused call:
    test_compiled_calls_follow_a_replaced_module_an_attribute_and_a_hook.)"""
    from rpt.model import RPTForCausalLM
    from tests.helpers.tiny_models import tiny_gpt2

    torch._dynamo.reset()
    model = RPTForCausalLM.from_base(tiny_gpt2(seed=1), window=2).eval()
    model.lm.generation_config.eos_token_id = None
    ids = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(3))
    first = generate(model, ids, NTP, compile="eager").sequences
    assert torch.equal(first, generate(model, ids, NTP).sequences)
    old = model.lm.lm_head
    head = nn.Linear(old.in_features, old.out_features, bias=False)
    head.weight.data = torch.randn(head.weight.shape, generator=torch.Generator().manual_seed(4))
    model.lm.lm_head = head
    got = generate(model, ids, NTP, compile="eager").sequences
    assert torch.equal(got, generate(model, ids, NTP).sequences) and not torch.equal(got, first)
    calls = []
    model.lm.transformer.h[0].mlp.register_forward_hook(lambda mod, args, out: calls.append(1) or out * 3)
    hooked = generate(model, ids, NTP, compile="eager").sequences
    assert calls and not torch.equal(hooked, got)
    assert torch.equal(hooked, generate(model, ids, NTP).sequences)
