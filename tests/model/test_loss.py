"""The tiled linear cross-entropy against the plain float32 computation, its accuracy in bf16, and its memory."""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from rpt.model import RPTForCausalLM
from rpt.model.loss import MIN_VOCAB_BLOCK, Blocks, linear_cross_entropy, plan_blocks
from rpt.model.objective import make_rpt_batch
from tests.helpers.tiny_models import tiny_gpt2, tiny_llama
from tests.helpers.train_helpers import ROOT, env

LLAMA3_VOCAB = 128256


def losses_and_grads(model, batch, labels_path: bool):
    model.zero_grad(set_to_none=True)
    kw = dict(position_ids=batch.position_ids, offset_ids=batch.offset_ids)
    if labels_path:
        loss = model(batch.input_ids, labels=batch.labels, kinds=batch.kinds, **kw).loss
    else:  # the plain float32 computation: whole-batch logits, then cross-entropy
        logits = model(batch.input_ids, **kw).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch.labels.reshape(-1))
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_close(ours, ref, rel=1e-4):
    (loss_a, grads_a), (loss_b, grads_b) = ours, ref
    assert abs(loss_a.item() - loss_b.item()) <= rel * abs(loss_b.item())
    assert grads_a.keys() == grads_b.keys()
    for name in grads_b:
        scale = grads_b[name].abs().max().clamp(min=1e-12)
        assert (grads_a[name] - grads_b[name]).abs().max() <= rel * scale, name


@pytest.fixture(scope="module")
def llama3_case():
    """A tiny Llama with a Llama-3 vocabulary, an RPT batch of 2 x 128 tokens (some ignored), and the
    plain float32 computation's loss and gradients on it (computed once: no tile budget changes it)."""
    torch.manual_seed(0)
    model = RPTForCausalLM.from_base(tiny_llama(vocab_size=LLAMA3_VOCAB), window=3).train()
    with torch.no_grad():
        model.offset_embedding.weight.normal_(std=0.1)
    rows = torch.randint(0, LLAMA3_VOCAB, (2, 129), generator=torch.Generator().manual_seed(1))
    batch = make_rpt_batch(rows, 3, 1.0, 0.2, generator=torch.Generator().manual_seed(2), num_inputs=128)
    batch.labels[0, :5] = -100  # ignored positions too
    return model, batch, losses_and_grads(model, batch, False)


@pytest.mark.parametrize("budget_rows", [None, 7 * MIN_VOCAB_BLOCK, 96])  # None: the default 32 MB budget
def test_equals_plain_float32_at_llama3_vocabulary(llama3_case, monkeypatch, budget_rows):
    """Several vocabulary blocks (default budget, and 7 x 512 rows' worth), and token blocks too (a
    budget below one 512-row block for every token)."""
    model, batch, ref = llama3_case
    n = 128
    if budget_rows:
        monkeypatch.setattr(model, "loss_chunk_bytes", 4 * 2 * n * budget_rows)
    blocks = plan_blocks(2 * n, LLAMA3_VOCAB, model.loss_chunk_bytes)
    assert blocks.vocab < LLAMA3_VOCAB  # several vocabulary blocks
    assert (blocks.tokens < 2 * n) == (budget_rows == 96)
    assert_close(losses_and_grads(model, batch, True), ref)


def test_plan_blocks_fits_the_budget():
    mb = 1 << 20
    # every token, vocabulary rows in multiples of 128 (2 x 1024 tokens, V = 128256, 32 MB: 4096 rows)
    assert plan_blocks(2048, 128256, 32 * mb) == Blocks(2048, 4096)
    assert plan_blocks(8192, 128256, 32 * mb) == Blocks(8192, 1024)  # the 1.3B benchmark's batch
    assert plan_blocks(100, 4096, 32 * mb) == Blocks(100, 4096)  # one tile
    # too many tokens for a 512-row block: tokens split, the tile still within the budget
    assert plan_blocks(1 << 20, 128256, 32 * mb) == Blocks(16384, MIN_VOCAB_BLOCK)
    for n, v, budget in ((1, 7, 1), (3000, 50000, 5 * mb), (10**6, 128256, 32 * mb), (513, 600, 4 * 513 * 600)):
        t, r = plan_blocks(n, v, budget)
        assert 1 <= t <= n and 1 <= r <= v
        assert t * r * 4 <= max(budget, 4 * min(v, MIN_VOCAB_BLOCK)), (n, v, budget)


@pytest.mark.parametrize("build", [tiny_llama, tiny_gpt2])
def test_one_chunk_path_equals_plain(build):
    model = RPTForCausalLM.from_base(build(vocab_size=97), window=3).eval()  # no dropout: two passes must agree
    rows = torch.randint(0, 97, (3, 41), generator=torch.Generator().manual_seed(3))
    batch = make_rpt_batch(rows, 3, 0.5, 0.3, generator=torch.Generator().manual_seed(4), num_inputs=40)
    assert_close(losses_and_grads(model, batch, True), losses_and_grads(model, batch, False))


def test_bias_scale_and_softcap_match_autograd():
    torch.manual_seed(0)
    h = torch.randn(37, 16, dtype=torch.float64).float().requires_grad_()
    w = (0.3 * torch.randn(50, 16)).requires_grad_()
    b = torch.randn(50).requires_grad_()
    y = torch.randint(0, 50, (37,))
    y[3] = -100
    for scale, cap in ((None, None), (0.7, None), (None, 2.0), (1.3, 1.5)):
        for blocks in ((5, 50), (64, 50), (37, 7), (5, 16), (64, 64)):
            ours = linear_cross_entropy(h, w, b, y, blocks, scale=scale, softcap=cap)
            z = h @ w.t() + b
            z = z * scale if scale else z
            z = cap * torch.tanh(z / cap) if cap else z
            ref = F.cross_entropy(z, y, reduction="none")
            weights = torch.linspace(0.5, 2.0, 37)  # a non-uniform upstream gradient
            ga = torch.autograd.grad((ours * weights).sum(), (h, w, b))
            gb = torch.autograd.grad((ref * weights).sum(), (h, w, b))
            assert torch.allclose(ours, ref, rtol=1e-5, atol=1e-6)
            for a, r in zip(ga, gb):
                assert (a - r).abs().max() <= 1e-5 * r.abs().max()


def test_softcapped_model_matches_its_own_logits():
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "Gemma2Config"):
        pytest.skip("no Gemma2 in this transformers")
    cfg = transformers.Gemma2Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=8, final_logit_softcapping=5.0)
    torch.manual_seed(0)
    model = RPTForCausalLM.from_base(transformers.Gemma2ForCausalLM(cfg), window=3).train()
    assert model.logit_transform() == (None, 5.0)
    rows = torch.randint(0, 97, (2, 25), generator=torch.Generator().manual_seed(5))
    batch = make_rpt_batch(rows, 3, 1.0, 0.3, generator=torch.Generator().manual_seed(6), num_inputs=24)
    assert_close(losses_and_grads(model, batch, True), losses_and_grads(model, batch, False))


def test_bf16_autocast_close_to_plain():
    model = RPTForCausalLM.from_base(tiny_llama(vocab_size=500), window=3).train()
    model.loss_chunk_bytes = 4 * 500 * 9
    rows = torch.randint(0, 500, (2, 33), generator=torch.Generator().manual_seed(7))
    batch = make_rpt_batch(rows, 3, 1.0, 0.3, generator=torch.Generator().manual_seed(8), num_inputs=32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = losses_and_grads(model, batch, True)
        ref = losses_and_grads(model, batch, False)
    assert_close(ours, ref, rel=3e-2)  # both round the head's product to bf16, in different orders


def test_llama3_vocabulary_step_adds_at_most_a_quarter_of_the_float32_logits():
    """One forward + backward with labels, V = 128256, 2 x 1024 tokens, a tiny body, in a fresh
    process: what it adds to peak memory (gradients included) must stay under 250 MB, a quarter of
    the 1 GB the float32 logits alone would take (benchmarks/loss_memory.py prints both losses)."""
    code = ("import json, benchmarks.loss_memory as m; "
            f"print(json.dumps(m.measure('chunked', {LLAMA3_VOCAB}, 2, 1024, 64, 2, 'cpu')))")
    out = subprocess.run([sys.executable, "-c", code], env=env(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["float32_logits_mb"] > 1000
    assert result["added_mb"] <= 250, result


@pytest.mark.parametrize("chunks", [1, 32, 256])
@pytest.mark.parametrize("split", ["vocab", "tokens"])
def test_bf16_weight_gradient_does_not_degrade_with_chunks(chunks, split):
    """The head's weight gradient from bf16 operands against float64 autograd on the same
    (bf16-representable) values: within 3e-3 relative, whatever the number of tiles, split over
    the vocabulary (one bf16 GEMM per slice, float32 inside) or over tokens (the slices' products
    summed in float32). A bf16 running sum gave 7e-3 at 32 chunks and 1.7e-2 at 256."""
    g = torch.Generator().manual_seed(0)
    n, h, v = 1024, 64, 512
    hidden = torch.randn(n, h, generator=g).to(torch.bfloat16)
    weight = (0.1 * torch.randn(v, h, generator=g)).to(torch.bfloat16)
    labels = torch.randint(0, v, (n,), generator=g)
    w64 = weight.double().requires_grad_(True)
    h64 = hidden.double().requires_grad_(True)
    torch.nn.functional.cross_entropy(h64 @ w64.t(), labels, reduction="sum").backward()
    w, hid = weight.clone().requires_grad_(True), hidden.clone().requires_grad_(True)
    blocks = (n, v // chunks) if split == "vocab" else (n // chunks, v)
    linear_cross_entropy(hid, w, None, labels, blocks).sum().backward()
    assert w.grad.dtype == torch.bfloat16
    rel = float((w.grad.double() - w64.grad).norm() / w64.grad.norm())
    assert rel < 3e-3, rel
    rel_h = float((hid.grad.double() - h64.grad).norm() / h64.grad.norm())
    assert rel_h < 3e-3, rel_h
