"""The decode's fused model call (``rpt/decode_forward/llama_forward.py``, ``rpt/decode_forward/fused_weights.py``).

Truths: Hugging Face's own forward over every column at once, with an explicit 4D mask written here
element by element from eq. 4's rule (not from ``rpt.decode_forward.visibility``), for the logits; the uncached
reference decoder for tokens; an unfused twin of the model for training after a decode. The graph checks
record the compiled step's FX graph with a backend that only records (dynamo's trace, no inductor).
"""

import copy
import re

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from rpt.decode_forward import llama_forward as decode_model
from rpt.decode_forward.llama_forward import DecodeModel, release_fused_weights, unsupported
from rpt.decode_forward.queries import ModelQueries, Visibility
from rpt.model import RPTForCausalLM
from rpt.sampling import SamplingConfig, generate, generate_reference
from tests.helpers.tiny_models import tiny_gpt2

V = 97
SHAPE = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=256, initializer_range=0.4)
ARCHS = {"llama": (LlamaConfig, LlamaForCausalLM, {}), "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
         "mistral": (MistralConfig, MistralForCausalLM, dict(sliding_window=None))}


def tiny(arch: str = "llama", layers: int = 2, seed: int = 0, dtype=torch.float32, **kw) -> RPTForCausalLM:
    config_cls, model_cls, extra = ARCHS[arch]
    torch.manual_seed(seed)
    cfg = config_cls(num_hidden_layers=layers, **SHAPE, **{**extra, **kw})
    cfg._attn_implementation = "sdpa"
    lm = model_cls(cfg).eval()
    if arch == "qwen2":  # q/k/v biases (zero at init): random, so that fusing them matters
        with torch.no_grad():
            for layer in lm.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.3)
    model = RPTForCausalLM.from_base(lm, window=3).to(dtype).eval()
    with torch.no_grad():
        model.offset_embedding.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(seed))
    model.lm.generation_config.eos_token_id = None
    return model


# ---- the logits: the fused call against Hugging Face's forward ------------------------------------------
PADS = torch.tensor([0, 3])
W = 12  # prompt columns 0 .. W-1; then x_W at column W and one PTP chain (lag 2) in scratch columns W+1, W+2
N = W
CHAIN_LIMIT = N - 3  # the chain re-predicts x_{N-2}: it sees the sequence before it


def block():
    """Every column's token, position, offset row, and who sees whom (``allowed[b, i, j]``, by hand)."""
    g = torch.Generator().manual_seed(3)
    seq = torch.randint(0, V, (2, N + 1), generator=g)
    source = list(range(N + 1)) + [N - 1, N]  # the chain feeds x_{N-1}, x_N with offset rows 1, 2
    ids = seq[:, source]
    positions = (torch.tensor(source)[None] - PADS[:, None]).clamp(min=0)
    offsets = torch.tensor([0] * (N + 1) + [1, 2]).expand(2, -1)
    cols = N + 3
    allowed = torch.zeros(2, cols, cols, dtype=torch.bool)
    for b in range(2):
        for i in range(cols):
            allowed[b, i, i] = True
            if i <= N:  # a sequence column: the row's tokens up to itself
                for j in range(PADS[b], i + 1):
                    allowed[b, i, j] = True
            else:  # the chain: the sequence up to CHAIN_LIMIT, and its own earlier tokens
                for j in list(range(PADS[b], CHAIN_LIMIT + 1)) + list(range(N + 1, i + 1)):
                    allowed[b, i, j] = True
    return ids, positions, offsets, allowed


def hf_truth(model, ids, positions, offsets, allowed) -> torch.Tensor:
    mask = torch.zeros(allowed.shape, dtype=model.dtype).masked_fill(~allowed, torch.finfo(model.dtype).min)
    with torch.no_grad():
        return model(ids, position_ids=positions, offset_ids=offsets, attention_mask=mask[:, None]).logits


@torch.no_grad()
def query_calls(queries: ModelQueries, ids, positions, offsets):
    """The prefill (columns 0 .. W-1) and the next call (x_W and the chain), through ``queries``."""
    prompt = torch.arange(W)
    first = queries(ids[:, :W], positions[:, :W], prompt, Visibility(prompt, PADS), kv_len=W, offsets=offsets[:, :W])
    cols = torch.tensor([N, N + 1, N + 2])
    vis = Visibility(torch.tensor([N, CHAIN_LIMIT, CHAIN_LIMIT]), PADS, torch.tensor([N, N + 1, N + 1]))
    second = queries(ids[:, W:], positions[:, W:], cols, vis, kv_len=N + 3, offsets=offsets[:, W:])
    return torch.cat([first, second], 1)


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_call_equals_hf_forward_with_an_explicit_mask(arch, dtype):
    """Llama (GQA), Qwen2 (q/k/v biases) and Mistral without a window: a ragged prefill, then x_W with a PTP
    chain in scratch columns, through the fused call, equal Hugging Face's forward over all columns at once
    with the mask written out by hand (float32: to 1e-5; bf16: within bf16's rounding of the logits)."""
    model = tiny(arch, dtype=dtype)
    queries = ModelQueries(model, 32)
    queries.refresh()
    assert queries.decode is not None, unsupported(model.lm)
    ids, positions, offsets, allowed = block()
    got = query_calls(queries, ids, positions, offsets)
    want = hf_truth(model, ids, positions, offsets, allowed)
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    else:
        scale = want.float().abs().max()
        assert (got.float() - want.float()).abs().max() <= 0.02 * scale
        truth32 = hf_truth(model.float(), ids, positions, offsets, allowed)
        assert (got.float() - truth32).abs().max() <= 0.04 * scale  # no worse than bf16 itself


def test_compiled_flex_call_equals_hf_forward(monkeypatch):
    """The GPU's attention (flex attention, the visibility rule as its ``score_mod``), run here in a compiled
    call: a ragged 13-token prefill with a PTP chain in the same block (15 queries, compiled in the query
    bucket of 16) equals Hugging Face's forward with the hand-written mask; attention read the cache's 2 KV
    heads over all its 64 columns."""
    monkeypatch.setattr(decode_model, "FLEX_DEVICES", {"cpu"})
    seen = []
    real = decode_model.flex_attention
    monkeypatch.setattr(decode_model, "flex_attention", lambda *a, **kw: seen.append(a[1].shape) or real(*a, **kw))
    torch._dynamo.reset()
    model = tiny(layers=1)
    queries = ModelQueries(model, 64, compile=True, compile_backend="eager")
    ids, positions, offsets, allowed = block()
    cols = torch.arange(N + 3)
    limit = torch.cat([torch.arange(N + 1), torch.tensor([CHAIN_LIMIT, CHAIN_LIMIT])])
    since = torch.cat([torch.arange(N + 1), torch.tensor([N + 1, N + 1])])
    with torch.no_grad():  # the cache's first call: the fused call allocates the KV, then runs compiled
        got = queries(ids, positions, cols, Visibility(limit, PADS, since), kv_len=N + 3, offsets=offsets)
    torch.testing.assert_close(got, hf_truth(model, ids, positions, offsets, allowed), atol=1e-5, rtol=1e-5)
    assert seen and all(shape == (2, 2, 64, 8) for shape in seen)


# ---- the compiled step's graph ------------------------------------------------------------------------
class Graphs:
    """A compile backend that records each graph dynamo traces and runs it as traced."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


def shape(node):
    value = node.meta.get("example_value")
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def step_graph(model, monkeypatch) -> tuple:
    """The compiled NTP step's graph of a short greedy decode (2 ragged rows), its tokens and the eager ones."""
    torch._dynamo.reset()
    backend = Graphs()
    ids = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    cfg = SamplingConfig(max_new_tokens=3, eos_token_id=[])
    compiled = generate(model, ids, cfg, attention_mask=mask, compile=backend).sequences
    # the step's graph (its inputs include the decode state ``s``), beside the prefill's
    (graph,) = [g for g in backend.graphs if any(n.name.startswith("l_s_") for n in g.graph.nodes)]
    return graph.graph, compiled, generate(model, ids, cfg, attention_mask=mask).sequences


def per_layer_gemms(graph) -> dict:
    """Matrix products by the layer whose weight they read (from the graph input's name, ``..layers_<i>_..``;
    None: outside the layers)."""
    products = {torch._C._nn.linear, torch.matmul, torch.mm, torch.bmm, torch.addmm, torch.einsum}
    counts: dict = {}
    for n in graph.nodes:
        if n.op == "call_function" and n.target in products:
            names = " ".join(a.name for a in n.all_input_nodes)
            found = re.search(r"layers_(?:modules_)?(\d+)_", names)
            layer = int(found.group(1)) if found else None
            counts[layer] = counts.get(layer, 0) + 1
    return counts


def test_the_compiled_step_makes_four_gemms_per_layer_and_attends_without_copies_or_a_mask(monkeypatch):
    """On the compiled NTP step's graph of a 2-layer model (the GPU's attention, flex, switched on here): 4
    matrix products per layer -- QKV, O, gate/up, down; HF's forward has 7 -- and the head's; attention
    called on the cache's K/V as they are (the KV heads, every column), no node expanding, cloning or
    repeating them, no mask tensor (no boolean node as wide as the cache); and the eager tokens."""
    monkeypatch.setattr(decode_model, "FLEX_DEVICES", {"cpu"})
    graph, compiled, eager = step_graph(tiny(layers=2), monkeypatch)
    assert torch.equal(compiled, eager)
    assert per_layer_gemms(graph) == {0: 4, 1: 4, None: 1}
    capacity = 64
    attention = [n for n in graph.nodes if "flex_attention" in str(n.target)]
    assert len(attention) == 2 and all(shape(n.args[1]) == shape(n.args[2]) == (2, 2, capacity, 8) for n in attention)
    assert not [n for n in graph.nodes if "scaled_dot_product" in str(n.target)]
    for n in graph.nodes:
        s = shape(n)
        if s is None:
            continue
        assert not (len(s) >= 4 and s[-2] == capacity and s[1] != 2), (n.format_node(), s)  # a K/V copy
        value = n.meta["example_value"]
        assert not (value.dtype == torch.bool and len(s) >= 3 and s[-1] == capacity), n.format_node()  # a mask
        copies = ("expand", "clone", "repeat", "contiguous", "reshape", "cat")
        if any(c in str(n.target) for c in copies):
            assert all(shape(a) is None or len(shape(a)) < 3 or shape(a)[-2] != capacity
                       for a in n.all_input_nodes), n.format_node()


@pytest.mark.slow
def test_the_graph_checks_see_hf_forward(monkeypatch):
    """The checks above fail on Hugging Face's forward (the fused call switched off): 7 products per layer,
    ``repeat_kv``'s expand of K and V, sdpa with a mask as wide as the cache. (1.7 s at load 2; the default-suite test
    of the guarantee: test_the_compiled_step_makes_four_gemms_per_layer_and_attends_without_copies_or_a_mask.)"""
    monkeypatch.setattr(decode_model, "ARCHITECTURES", {})
    graph = step_graph(tiny(layers=2), monkeypatch)[0]
    assert per_layer_gemms(graph) == {0: 7, 1: 7, None: 1}
    nodes = list(graph.nodes)
    assert any("expand" in str(n.target) and shape(n) is not None and shape(n)[-2] == 64 for n in nodes)
    assert any(shape(n) is not None and n.meta["example_value"].dtype == torch.bool and shape(n)[-1] == 64
               for n in nodes)


# ---- the fused weights: the decode's own copy, following the parameters ---------------------------------
def stacked_bytes(model) -> int:
    """Bytes of the q/k/v and gate/up weights (and biases): what the decode's copy holds."""
    names = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if any(k in n for k in names))


def test_the_copy_is_the_decodes_own_and_a_checkpoint_still_saves(tmp_path):
    """After a decode each layer's fused matrices hold the q/k/v (gate/up) weights stacked, in storage no
    parameter shares, their bytes exactly those of the stacked weights (the copy's memory cost); the
    parameters keep their storage, names and state_dict keys; a save/load round trip, and the model once
    its copies are released, decode the same tokens."""
    model = tiny()
    keys = list(model.state_dict())
    storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    ids = torch.randint(0, V, (2, 6), generator=torch.Generator().manual_seed(2))
    cfg = SamplingConfig(max_new_tokens=6, eos_token_id=[])
    out = generate(model, ids, cfg).sequences
    fused = DecodeModel.for_model(model).layers
    for layer, f in zip(model.lm.model.layers, fused):
        attn, mlp = layer.self_attn, layer.mlp
        assert torch.equal(f.qkv.tensor, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
        assert torch.equal(f.gate_up.tensor, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
        assert not {f.qkv.tensor.untyped_storage().data_ptr(), f.gate_up.tensor.untyped_storage().data_ptr()} & storages
    copies = sum(g.tensor.numel() * g.tensor.element_size() for f in fused for g in f.groups)
    assert copies == stacked_bytes(model) and {p.untyped_storage().data_ptr() for p in model.parameters()} == storages
    assert list(model.state_dict()) == keys
    release_fused_weights(model.lm)  # freed; the next decode builds the copies again
    assert torch.equal(generate(model, ids, cfg).sequences, out)
    model.save_pretrained(tmp_path)
    again = RPTForCausalLM.from_pretrained(tmp_path).eval()
    again.lm.generation_config.eos_token_id = None
    assert torch.equal(generate(again, ids, cfg).sequences, out)


def test_accelerate_checkpoints_every_weight_after_a_decode(tmp_path):
    """accelerate's save_state drops tensors that share storage from its safetensors file: after a decode no
    weight shares any (the copies are the decode's own), so every weight is saved with its value, with no
    release needed."""
    from accelerate import Accelerator
    from safetensors.torch import load_file

    model = tiny()
    ids = torch.randint(0, V, (1, 5), generator=torch.Generator().manual_seed(3))
    cfg = SamplingConfig(max_new_tokens=4, eos_token_id=[])
    out = generate(model, ids, cfg).sequences
    want = {k: v.clone() for k, v in model.state_dict().items()}
    accelerator = Accelerator(cpu=True)
    prepared = accelerator.prepare(model)
    accelerator.save_state(str(tmp_path / "state"))
    saved = load_file(str(tmp_path / "state" / "model.safetensors"))
    assert set(saved) == set(want) and all(torch.equal(saved[k], want[k]) for k in want)
    assert torch.equal(generate(prepared, ids, cfg).sequences, out)


def edits():
    """Ways to change a weight after a decode: in place, through load_state_dict (copying, or assigning new
    storage), by assigning ``.data``, and a dtype change."""
    def in_place(m):
        with torch.no_grad():
            m.lm.model.layers[0].self_attn.k_proj.weight.mul_(-1.5)
            m.lm.model.layers[1].mlp.up_proj.weight.add_(0.2)

    def load(assign):
        def edit(m):
            state = {k: (v * 1.3 if "q_proj" in k or "gate_proj" in k else v).clone() for k, v in m.state_dict().items()}
            m.load_state_dict(state, assign=assign)
        return edit

    def data(m):
        p = m.lm.model.layers[1].self_attn.v_proj.weight
        p.data = p.data.clone() * -2

    return {"in place": in_place, "load_state_dict": load(False), "load_state_dict assign": load(True), ".data": data,
            "to float64": lambda m: m.to(torch.float64)}


@pytest.mark.parametrize("edit", list(edits()))
def test_a_weight_changed_after_a_decode_is_seen_by_the_next(edit):
    """The next decode (eager) equals the uncached reference on the edited weights, and differs from the first;
    the copies were refilled in place (the same matrices, unless the dtype changed), sharing no storage with
    the parameters."""
    model = tiny()
    ids = torch.randint(0, V, (2, 6), generator=torch.Generator().manual_seed(4))
    cfg = SamplingConfig(max_new_tokens=8, eos_token_id=[], rpt_iters=1, rpt_window=3, confidence=0.5)
    first = generate(model, ids, cfg).sequences
    matrix = DecodeModel.for_model(model).layers[1].qkv.tensor
    edits()[edit](model)
    second = generate(model, ids, cfg).sequences
    assert torch.equal(second, generate_reference(model, ids, cfg).sequences)
    assert torch.equal(second, first) == (edit == "to float64")  # the same values, in another dtype
    layers = DecodeModel.for_model(model).layers
    assert (layers[1].qkv.tensor is matrix) == (edit != "to float64")
    v = model.lm.model.layers[1].self_attn.v_proj.weight
    assert layers[1].qkv.tensor.untyped_storage().data_ptr() != v.untyped_storage().data_ptr()


def test_training_after_a_decode_is_training_of_the_unfused_model():
    """A decode (in inference mode), then a training step -- forward with labels,
    backward, AdamW -- gives the gradients and weights of an unfused twin exactly, and the next decode
    follows the trained weights."""
    model = tiny()
    twin = copy.deepcopy(model)
    ids = torch.randint(0, V, (2, 6), generator=torch.Generator().manual_seed(5))
    cfg = SamplingConfig(max_new_tokens=6, eos_token_id=[])
    generate(model, ids, cfg)
    batch = torch.randint(0, V, (2, 10), generator=torch.Generator().manual_seed(6))
    for m in (model, twin):
        m.train()
        opt = torch.optim.AdamW(m.parameters(), lr=0.05)
        m(batch, labels=batch).loss.backward()
        opt.step()
        m.eval()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(p.grad, q.grad) and torch.equal(p, q), name
    assert torch.equal(generate(model, ids, cfg).sequences, generate_reference(twin, ids, cfg).sequences)


# ---- what keeps Hugging Face's forward --------------------------------------------------------------------
def lora_llama():
    from rpt.model.lora import add_lora

    model = tiny()
    add_lora(model, {"r": 4})
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)  # B is zero at init: a nonzero adapter, so that ignoring it would show
    return model


def hooked_llama():
    model = tiny()
    model.lm.model.layers[1].mlp.register_forward_hook(lambda module, args, out: out * 0.5)
    return model


OTHERS = {
    "gpt2": lambda: RPTForCausalLM.from_base(tiny_gpt2(seed=1), window=2).eval(),
    "sliding window": lambda: tiny("mistral", sliding_window=4096),
    "q/k norms": lambda: RPTForCausalLM.from_base(
        Qwen3ForCausalLM(Qwen3Config(num_hidden_layers=2, head_dim=8, **SHAPE)).eval(), window=2).eval(),
    "attention bias on q only": None,
    "lora": lora_llama,
    "hook": hooked_llama,
}


def q_bias_only():
    model = tiny()
    with torch.no_grad():
        model.lm.model.layers[0].self_attn.q_proj.bias = torch.nn.Parameter(torch.ones(32))
    return model


OTHERS["attention bias on q only"] = q_bias_only


@pytest.mark.parametrize("kind", list(OTHERS))
def test_models_it_does_not_fit_keep_their_own_forward(kind):
    """GPT-2 (``c_attn``), a sliding window, Qwen3's q/k norms, a bias the fused matrix would drop, LoRA-wrapped
    projections, a forward hook: no fused call, and the decode (through the model's own forward) equals the
    uncached reference."""
    model = OTHERS[kind]()
    model.lm.generation_config.eos_token_id = None
    assert DecodeModel.for_model(model) is None and unsupported(model.lm)
    ids = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(7))
    cfg = SamplingConfig(max_new_tokens=5, eos_token_id=[], rpt_iters=1, rpt_window=2, confidence=0.5)
    assert torch.equal(generate(model, ids, cfg).sequences, generate_reference(model, ids, cfg).sequences)


def test_a_hook_added_after_a_decode_is_not_skipped():
    """A forward hook on a module whose forward the fused call bypasses (the MLP), added after a fused decode:
    the next decode runs the model's own forward, and the hook."""
    model = tiny()
    ids = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(8))
    cfg = SamplingConfig(max_new_tokens=6, eos_token_id=[])
    before = generate(model, ids, cfg).sequences
    queries = ModelQueries(model, 16)  # one built before the hook (a pooled compiled decode's), checked again
    queries.refresh()
    assert queries.decode is not None
    model.lm.model.layers[1].mlp.register_forward_hook(lambda module, args, out: out * 3)
    queries.refresh()
    assert queries.decode is None
    after = generate(model, ids, cfg).sequences
    assert torch.equal(after, generate_reference(model, ids, cfg).sequences) and not torch.equal(after, before)


def test_an_adapter_injected_after_a_decode_is_not_skipped():
    """LoRA injected into a model that already decoded fused: the next decode sees the wrapped projections,
    runs the model's own forward, and follows the adapter."""
    model = tiny()
    ids = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(8))
    cfg = SamplingConfig(max_new_tokens=6, eos_token_id=[])
    queries = ModelQueries(model, 16)
    queries.refresh()
    assert queries.decode is not None
    from rpt.model.lora import add_lora

    add_lora(model, {"r": 4})
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    queries.refresh()
    assert queries.decode is None
    assert torch.equal(generate(model, ids, cfg).sequences, generate_reference(model, ids, cfg).sequences)


# ---- compiled prefills, and the GPU's attention over whole decodes -----------------------------------------
def test_a_large_call_compiles_in_its_bucket_only_where_its_padding_fits():
    """A call of more than 8 queries (a prefill) is padded to the next power of two with inert queries in the
    cache's last columns: compiled where those lie past the call's own columns and inside the cache, eager
    otherwise (a 100-column cache, as a sliding window makes, cannot hold a 128-query bucket)."""
    model = tiny(layers=1)
    queries = ModelQueries(model, 64, compile=True, compile_backend="eager")
    assert queries._compiles(8, torch.arange(56, 64))  # a step's block: the last 7 columns are kept free
    assert queries._compiles(13, torch.arange(13)) and queries._compiles(40, torch.arange(40))
    assert not queries._compiles(13, torch.arange(50, 63))  # its 3 padding queries would overwrite 61, 62
    queries.capacity = 100
    assert queries._compiles(40, torch.arange(40)) and not queries._compiles(70, torch.arange(70))


FLEX_CASES = {  # name: (batch, prompt lengths (left-padded), RPT iterations)
    "ntp batch 1": (1, (9,), 0), "ntp batch 4 ragged": (4, (9, 5, 12, 7), 0), "ntp batch 16": (16, (10,) * 16, 0),
    "rpt batch 1": (1, (9,), 2), "rpt batch 4 ragged": (4, (9, 5, 12, 7), 1), "rpt batch 16 ragged": (16, (10, 6) * 8, 1),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(FLEX_CASES))
def test_flex_attention_decodes_equal_eager_and_reference(monkeypatch, case):
    """The GPU's compiled attention (flex, switched on here) over whole decodes, NTP and RPT (corrections:
    confidence 0.3), batch 1, 4 ragged and 16, float32, prefills of 9-12 tokens compiled in their bucket:
    the eager (sdpa) and reference tokens. (2-6 s each at load 2; the default-suite tests of the guarantee:
    test_compiled_flex_call_equals_hf_forward, test_the_compiled_step_makes_four_gemms_per_layer_and_attends_without_copies_or_a_mask.)"""
    monkeypatch.setattr(decode_model, "FLEX_DEVICES", {"cpu"})
    batch, lengths, k = FLEX_CASES[case]
    width = max(lengths)
    ids = torch.randint(0, V, (batch, width), generator=torch.Generator().manual_seed(batch + k))
    mask = (torch.arange(width)[None] >= width - torch.tensor(lengths)[:, None]).long()
    cfg = SamplingConfig(max_new_tokens=10, eos_token_id=[], rpt_iters=k, rpt_window=3, confidence=0.3)
    torch._dynamo.reset()
    model = tiny()
    eager = generate(model, ids, cfg, attention_mask=mask)
    compiled = generate(model, ids, cfg, attention_mask=mask, compile="eager")
    assert torch.equal(compiled.sequences, eager.sequences)
    assert torch.equal(eager.sequences, generate_reference(model, ids, cfg, attention_mask=mask).sequences)
    assert compiled.stats["corrections"] == eager.stats["corrections"]


@pytest.mark.slow
def test_a_weight_given_new_storage_between_compiled_decodes_needs_no_recompile():
    """``load_state_dict(assign=True)`` between two compiled decodes: the stacked copies are refilled in
    place (same tensors, same addresses), so the second decode runs the first one's graphs, on the new
    weights (the reference's tokens). (0.8 s at load 2; the default-suite test of the guarantee:
    test_a_weight_changed_after_a_decode_is_seen_by_the_next.)"""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = tiny()
    ids = torch.randint(0, V, (2, 6), generator=torch.Generator().manual_seed(9))
    cfg = SamplingConfig(max_new_tokens=8, eos_token_id=[])
    generate(model, ids, cfg, compile="eager")
    graphs = counters["stats"]["unique_graphs"]
    edits()["load_state_dict assign"](model)
    out = generate(model, ids, cfg, compile="eager")
    assert counters["stats"]["unique_graphs"] == graphs
    assert torch.equal(out.sequences, generate_reference(model, ids, cfg).sequences)


def test_flex_attention_only_where_its_kernels_run(monkeypatch):
    """Flex attention is the compiled call's kernel on a flex device in float16 / bfloat16 / float32; eager
    calls and float64 (the exactness tests' dtype, which its GPU kernels do not promise) take sdpa."""
    monkeypatch.setattr(decode_model, "FLEX_DEVICES", {"cpu"})
    vis, cols = Visibility(torch.tensor([3])), torch.tensor([3])

    def kernel(dtype, compiling):
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
        return decode_model._attention(vis, cols, 1, torch.zeros(1, dtype=dtype), 8, plain=False).__name__

    assert [kernel(torch.float32, True), kernel(torch.bfloat16, True)] == ["flex", "flex"]
    assert [kernel(torch.float64, True), kernel(torch.float32, False)] == ["sdpa", "sdpa"]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("batch", [1, 16])
def test_cuda_flex_attention_equals_sdpa(batch):
    """On a GPU: inductor's flex kernels (decoding for the steps, attention for the prefills) at Llama-3.2-1B's
    heads, each query block the decode compiles (NTP, RPT with PTP chains, prefills), ragged rows, float32,
    equal sdpa with the mask (``benchmarks/flex_decode_check.py`` does the same in bf16 and times it)."""
    from benchmarks.flex_decode_check import attend, block

    device = torch.device("cuda")
    decode_model.FLEX_DEVICES.add("cuda")
    for q in (1, 2, 4, 16, 64):
        vis, columns = block(batch, q, 256, device)
        g = torch.Generator(device=device).manual_seed(q)
        qs = torch.randn(batch, 32, q, 64, device=device, generator=g)
        ks, vs = (torch.randn(batch, 8, 256, 64, device=device, generator=g) for _ in range(2))
        inputs = (qs, ks, vs, vis.limit, vis.start, vis.since, columns)
        torch._dynamo.reset()
        got = torch.compile(attend, fullgraph=True, dynamic=False)(*inputs)
        torch.testing.assert_close(got, attend(*inputs), atol=1e-4, rtol=1e-4)
