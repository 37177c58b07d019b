"""What a training step runs on, checked on the CPU where a GPU's speed depends on it: the dtype of
every matrix product of a bf16 step (tensor cores), the optimizer's kernel, the attention kernel."""

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry, shape_wrapper
from transformers import LlamaConfig, LlamaForCausalLM

from rpt.model import RPTForCausalLM
from rpt.model.loss import Blocks, plan_blocks
from rpt.training.config import TrainConfig
from rpt.training.measure.gemm_census import GemmCensus
from rpt.training.measure.step_profile import CATEGORIES, category, profile_steps
from rpt.training.setup import build_optimizer, optimizer_kernel
from rpt.training.step import forward, make_batch


def llama(vocab: int, layers: int, seq: int, attn: str = "sdpa", hidden: int = 128) -> RPTForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=seq + 1)
    cfg._attn_implementation = attn
    model = RPTForCausalLM.from_base(LlamaForCausalLM(cfg), window=3).train()
    with torch.no_grad():
        model.offset_embedding.weight.normal_(std=0.1)
    return model


def train_config(objective: str, seq: int) -> TrainConfig:
    return TrainConfig(model="x", data="x", objective=objective, seq_len=seq, window=3, s=1.0, q=0.05)


@pytest.mark.parametrize("objective", ["ntp", "rpt"])
def test_bf16_step_runs_no_float32_matrix_product(objective):
    """One bf16-autocast step of a 2-layer grouped-query Llama, V = 8192, T = 128, its loss head in four
    vocabulary tiles (as a 32000-word head is at T = 512): every product (the body's, the attention's and
    the loss head's forward, recomputation and both gradients) takes bf16 operands. The head's weight
    gradient included."""
    model = llama(8192, 2, 128, hidden=64)  # the head outweighs the body: a head product missed fails the count
    model.loss_chunk_bytes = 4 * 256 * 2048  # 2048-row tiles of the 256 tokens' logits: the multi-tile path
    assert plan_blocks(256, 8192, model.loss_chunk_bytes) == Blocks(256, 2048)
    optimizer = build_optimizer(model, train_config(objective, 128))
    rows = torch.randint(0, 8192, (2, 129), generator=torch.Generator().manual_seed(0))
    batch = make_batch(train_config(objective, 128), rows, 1, 0)
    with GemmCensus() as census:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = forward(model, batch)
        out.loss.backward()
        optimizer.step()
    head = 2 * 256 * 64 * 8192  # one [tokens, hidden] x [hidden, vocab] product
    assert census.flops[torch.bfloat16] >= 4 * head  # forward, recomputation, both gradients: all seen
    assert census.share(torch.float32) == 0.0, census.shapes.get(torch.float32)
    assert torch.isfinite(out.loss)


def test_census_sees_float32_products():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with GemmCensus() as census:
        torch.mm(a, b)
        torch.zeros(8, 4).addmm_(a, b)  # an in-place product counts as its out-of-place form
        torch.mm(a.bfloat16(), b.bfloat16())
    assert census.flops[torch.float32] == 2 * 2 * 8 * 16 * 4
    assert census.share(torch.float32) == pytest.approx(2 / 3)


def _torch_211_formula(backward: bool):
    """torch 2.11's sdpa FLOP formulas: they assert that q, k and v have the same number of heads."""
    def formula(*shapes, out_shape=None, **kwargs):
        q, k, v = shapes[1:4] if backward else shapes[:3]
        assert q[1] == k[1] == v[1], f"query/key/value shapes are incompatible: q={q}, k={k}, v={v}"
        b, h, s, d = q
        return (10 if backward else 4) * b * h * s * k[2] * d
    return shape_wrapper(formula)


def test_census_counts_grouped_query_attention_on_any_torch(monkeypatch):
    """q [4,2,256,64], k/v [4,1,256,64] (GQA) on meta tensors, through every sdpa kernel (flash, efficient,
    cuDNN, the CPU's), forward and backward, with torch's formulas replaced by 2.11's asserting ones:
    counted as the kernels compute it, k/v broadcast to the query's heads (and the CPU kernel counted at all)."""
    aten = torch.ops.aten
    for name in ("flash", "efficient", "cudnn"):
        monkeypatch.setitem(flop_registry, getattr(aten, f"_scaled_dot_product_{name}_attention"), _torch_211_formula(False))
        monkeypatch.setitem(flop_registry, getattr(aten, f"_scaled_dot_product_{name}_attention_backward"),
                            _torch_211_formula(True))
    meta = {"device": "meta"}
    q, k, v = torch.empty(4, 2, 256, 64, **meta), torch.empty(4, 1, 256, 64, **meta), torch.empty(4, 1, 256, 64, **meta)
    lse, seed = torch.empty(4, 2, 256, **meta), torch.empty((), dtype=torch.long, **meta)
    forwards = [
        lambda: aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True),
        lambda: aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, True),
        lambda: aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True),
        lambda: aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True),
    ]
    backwards = [
        lambda: aten._scaled_dot_product_flash_attention_backward(q, q, k, v, q, lse, None, None, 256, 256, 0.0, True,
                                                                  seed, seed),
        lambda: aten._scaled_dot_product_efficient_attention_backward(q, q, k, v, None, q, lse, seed, seed, 0.0,
                                                                      [True, True, True, False], True),
        lambda: aten._scaled_dot_product_cudnn_attention_backward(q, q, k, v, q, lse.unsqueeze(-1), seed, seed, None,
                                                                  None, None, 256, 256, 0.0, True),
        lambda: aten._scaled_dot_product_flash_attention_for_cpu_backward(q, q, k, v, q, lse, 0.0, True),
    ]
    # per (batch, query head): scores and output are two [256 x 64] x [64 x 256]-sized products (2 FLOPs per
    # multiply-add); the backward recomputes the scores and forms three more gradients' products
    product = 2 * 256 * 256 * 64
    for calls, products in ((forwards, 2), (backwards, 5)):
        for call in calls:
            with GemmCensus() as census:
                call()
            assert census.flops[torch.float32] == 4 * 2 * products * product, call


def test_step_profile_attributes_a_steps_time_to_its_kernels():
    """rpt.training.measure.step_profile on the CPU: one step of both objectives profiled, its time split over the five
    categories (all present, adding up to 1), the table naming the top operations; and CUDA kernel
    names attributed by the operation and the ranges that launched them."""
    for objective in ("ntp", "rpt"):
        model = llama(512, 1, 64, hidden=32)
        cfg = train_config(objective, 64)
        optimizer = build_optimizer(model, cfg)
        batch = make_batch(cfg, torch.randint(0, 512, (2, 65), generator=torch.Generator().manual_seed(0)), 1, 0)

        def step(model=model, batch=batch, optimizer=optimizer):
            forward(model, batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        profile = profile_steps(step, 1)
        shares = profile.shares()
        assert set(shares) == set(CATEGORIES) and all(shares[c] > 0 for c in CATEGORIES), shares
        assert sum(shares.values()) == pytest.approx(1.0)
        # every operation listed: on a loaded machine the elementwise ops of a one-step profile can push the
        # matrix products out of a top-5 (seen at load 6 on 2 cores)
        table = profile.table(top=len(profile.time_us))
        assert "aten::mm" in table and table.splitlines()[-1].startswith("shares: gemm")
        assert len(profile.table(top=5).splitlines()) == 5 + 3  # the heading, the columns, 5 rows, the shares
    assert category(["aten::mm", "aten::matmul", "aten::linear"], "sm90_xmma_gemm_bf16bf16_bf16f32") == "gemm"
    assert category(["aten::mm", "LinearCrossEntropyBackward"], "sm90_xmma_gemm_bf16bf16") == "loss head"
    assert category(["aten::_fused_adamw_", "Optimizer.step#AdamW.step"], "multi_tensor_apply_kernel") == "optimizer"
    assert category(["aten::_flash_attention_backward"], "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel") == "attention"
    assert category(["aten::mul", "CompiledFunction"], "triton_poi_fused_mul_silu_0") == "elementwise & other"
    assert category(["aten::addmm", "CompiledFunction"], "nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_NTN") == "gemm"


def test_fused_adamw_is_chosen_where_torch_has_it():
    assert optimizer_kernel("cuda") == {"fused": True}
    assert optimizer_kernel(torch.device("cuda", 1)) == {"fused": True}
    assert optimizer_kernel("cpu") == {"fused": True}
    assert optimizer_kernel("meta") == {"foreach": True}  # no fused kernel there: the multi-tensor one
    model = llama(300, 1, 16, hidden=32)
    optimizer = build_optimizer(model, train_config("rpt", 16), torch.device("cuda"))
    assert optimizer.defaults["fused"] is True and not optimizer.defaults["foreach"]
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]


def test_fused_adamw_steps_equal_foreach_steps():
    """Two steps of the fused AdamW and two of the foreach one from the same state and gradients."""
    params = {}
    for kernel in ({"fused": True}, {"foreach": True}):
        model = llama(300, 2, 16, hidden=32)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, **kernel)
        for step in range(2):
            gen = torch.Generator().manual_seed(step)
            for p in model.parameters():
                p.grad = torch.randn(p.shape, generator=gen)
            optimizer.step()
        params[next(iter(kernel))] = [p.detach().clone() for p in model.parameters()]
    moved = 0.0
    start = [p.detach() for p in llama(300, 2, 16, hidden=32).parameters()]
    for fused, foreach, before in zip(params["fused"], params["foreach"], start):
        torch.testing.assert_close(fused, foreach, rtol=1e-6, atol=1e-7)
        moved = max(moved, float((foreach - before).abs().max()))
    assert moved > 1e-3  # the steps did move the weights


class AttentionWatch(TorchDispatchMode):
    """The attention kernels dispatched, and any tensor of shape [..., T, T] (a dense mask or scores)."""

    def __init__(self, length: int):
        super().__init__()
        self.length, self.kernels, self.square = length, set(), []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if "attention" in func.__name__:
            self.kernels.add(func.__name__.split(".")[0])
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor) and o.dim() >= 2 and o.shape[-2:] == (self.length, self.length):
                self.square.append((func.__name__, tuple(o.shape)))
        return out


@pytest.mark.parametrize("objective", ["ntp", "rpt"])
def test_training_attention_is_the_fused_causal_kernel_at_2048(objective):
    """Both objectives' forward and backward at T = 2048 run sdpa's fused (flash) kernel with no
    [batch, 1, T, T] mask and no T x T scores; loss and gradients equal the eager (explicit-mask,
    explicit-softmax) attention of the same model."""
    T = 2048
    rows = torch.randint(0, 256, (2, T + 1), generator=torch.Generator().manual_seed(1))
    batch = make_batch(train_config(objective, T), rows, 1, 0)
    if objective == "rpt":
        assert (batch.position_ids != torch.arange(T)).any()  # permuted
    results = {}
    for attn in ("sdpa", "eager"):
        model = llama(256, 1, T, attn=attn, hidden=64)
        watch = AttentionWatch(T)
        with watch:
            out = forward(model, batch)
            out.loss.backward()
        results[attn] = (out.loss.detach(), {n: p.grad for n, p in model.named_parameters()}, watch)
    (loss, grads, watch), (ref_loss, ref_grads, ref_watch) = results["sdpa"], results["eager"]
    assert watch.kernels == {"_scaled_dot_product_flash_attention_for_cpu",
                             "_scaled_dot_product_flash_attention_for_cpu_backward"}, watch.kernels
    assert watch.square == []
    assert ref_watch.square  # the eager attention does build T x T tensors: the watch sees them
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    for name, g in ref_grads.items():
        assert float((grads[name] - g).norm() / g.norm()) < 1e-4, name


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_bf16_steps_fused_and_compiled_equal_eager():
    """On a GPU: the fused AdamW is what training builds, the bf16 step's products are all bf16, and
    three steps with compiled blocks give eager's losses."""
    from rpt.training.compiled_blocks import compile_blocks

    cfg = train_config("rpt", 256)
    rows = torch.randint(0, 32000, (4, 257), generator=torch.Generator().manual_seed(0))
    losses = {}
    for compiled in (False, True):
        model = llama(32000, 2, 256).cuda()
        if compiled:
            compile_blocks(model)
        optimizer = build_optimizer(model, cfg, torch.device("cuda"))
        assert optimizer.defaults["fused"] is True
        losses[compiled] = []
        for step in range(1, 4):
            batch = make_batch(cfg, rows, step, 0).to("cuda")
            census = GemmCensus() if step == 1 and not compiled else contextlib.nullcontext()
            with census:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    out = forward(model, batch)
                out.loss.backward()
            if isinstance(census, GemmCensus):
                assert census.share(torch.float32) == 0.0, census.shapes.get(torch.float32)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses[compiled].append(out.loss.item())
    assert losses[True] == pytest.approx(losses[False], rel=2e-2)  # bf16: kernels round differently
