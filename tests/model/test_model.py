import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, DynamicCache

from rpt.model import RPTForCausalLM
from rpt.model.objective import make_rpt_batch, ntp_batch, window_permutation
from tests.helpers.tiny_models import tiny_gpt2, tiny_llama

BUILDERS = {"llama": tiny_llama, "gpt2": tiny_gpt2}


def randomise_table(model: RPTForCausalLM, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.offset_embedding.weight.copy_(torch.randn(model.offset_embedding.weight.shape, generator=g))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_zero_initialised_wrapper_equals_base(arch, attn):
    base = BUILDERS[arch](attn=attn)
    x = torch.randint(0, 97, (3, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = base(x).logits
        model = RPTForCausalLM.from_base(base, window=3)
        assert model.offset_embedding.weight.abs().sum() == 0
        plain = model(x).logits
        # a permuted-format batch with the identity permutation is also the base model
        b = ntp_batch(x)
        ident = model(b.input_ids, position_ids=b.position_ids, offset_ids=b.offset_ids).logits
    assert (plain - ref).abs().max() < 1e-5
    assert (ident - ref).abs().max() < 1e-5


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("window", [2, 3])
def test_ptp_position_equals_hand_built_conditional(arch, window):
    """Position k..k+w-2 of a swap window gives p(x_k | x_<k, x_{k+1..}) as fed by hand on a cache."""
    model = RPTForCausalLM.from_base(BUILDERS[arch](), window=window)
    randomise_table(model)
    x = torch.randint(0, 97, (1, 12), generator=torch.Generator().manual_seed(2))
    k = 4
    sigma, tau = window_permutation(12, [k], window)
    from rpt.model.objective import offset_to_row

    with torch.no_grad():
        permuted = model(
            x[:, sigma - 1], position_ids=(sigma - 1)[None], offset_ids=offset_to_row(tau - sigma, window)[None],
            use_cache=False,  # the training path: no cache, so transformers inspects position_ids
        ).logits[0]
        for l in range(1, window):
            # Hand-built: context x_<k in natural order through a KV cache, then x_{k+1..k+l} at
            # their own positions with offsets -1..-l; read the logits at the last one.
            cache = DynamicCache(config=model.config)
            ctx = x[:, : k - 1]
            model(ctx, past_key_values=cache, use_cache=True)
            later = x[:, k : k + l]
            pos = torch.arange(k, k + l)[None]
            offsets = torch.arange(1, l + 1)[None]
            hand = model(later, position_ids=pos, offset_ids=offsets, past_key_values=cache, use_cache=True).logits[0, -1]
            i = k - 1 + l - 1  # 0-based index of the PTP-l position in the permuted sequence
            assert int(tau[i]) == k and int(sigma[i]) == k + l
            assert (permuted[i] - hand).abs().max() < 1e-5
        # and it is a different conditional from plain NTP at that place
        ntp = model(x[:, : k]).logits[0, -1]
        assert (permuted[k - 1] - ntp).abs().max() > 1e-3


def test_loss_is_eq13_and_split_by_kind():
    model = RPTForCausalLM.from_base(tiny_llama(), window=3)
    randomise_table(model)
    x = torch.randint(0, 97, (4, 41), generator=torch.Generator().manual_seed(3))
    b = make_rpt_batch(x, window=3, s=1.0, q=0.3, generator=torch.Generator().manual_seed(0), num_inputs=40)
    out = model(b.input_ids, position_ids=b.position_ids, offset_ids=b.offset_ids, labels=b.labels, kinds=b.kinds)
    assert out.logits is None  # the loss path never holds the batch's logits (rpt.model.loss)
    logits = model(b.input_ids, position_ids=b.position_ids, offset_ids=b.offset_ids).logits
    ce = F.cross_entropy(logits.reshape(-1, 97), b.labels.reshape(-1), reduction="none").view(4, 40)
    assert out.loss.item() == pytest.approx(ce.mean().item(), rel=1e-5)
    assert out.ntp_loss.item() == pytest.approx(ce[b.kinds == 0].mean().item(), rel=1e-5)
    for l in (1, 2):
        assert (b.kinds == l).any()
        assert out.ptp_loss[l - 1].item() == pytest.approx(ce[b.kinds == l].mean().item(), rel=1e-5)
    assert out.kind_count.sum().item() == 160
    assert out.loss_dict().keys() == {"loss", "ntp_loss", "ptp_loss_1", "ptp_loss_2"}


def test_ntp_batch_loss_equals_base_model_labels_loss():
    base = tiny_llama()
    x = torch.randint(0, 97, (2, 30), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = base(x, labels=x).loss
        model = RPTForCausalLM.from_base(base, window=2)
        b = ntp_batch(x, num_inputs=29)
        out = model(b.input_ids, position_ids=b.position_ids, offset_ids=b.offset_ids, labels=b.labels, kinds=b.kinds)
    assert out.loss.item() == pytest.approx(ref.item(), rel=1e-5)
    assert torch.isnan(out.ptp_loss).all()


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_save_and_load_round_trip(tmp_path, arch):
    model = RPTForCausalLM.from_base(BUILDERS[arch](), window=3)
    randomise_table(model)
    x = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(5))
    b = make_rpt_batch(x, window=3, s=1.0, q=0.3, generator=torch.Generator().manual_seed(1))
    kw = dict(position_ids=b.position_ids, offset_ids=b.offset_ids)
    with torch.no_grad():
        before = model(b.input_ids, **kw).logits
        model.save_pretrained(tmp_path)
        loaded = RPTForCausalLM.from_pretrained(tmp_path)
        after = loaded(b.input_ids, **kw).logits
        assert loaded.window == 3
        # the NTP row is folded into the saved embedding (rpt.checkpoint.folded_weights): one float32 rounding
        assert (before - after).abs().max() < 1e-5
        # smaller sampling windows are fine, larger ones are not
        assert RPTForCausalLM.from_pretrained(tmp_path, window=2).window == 3
        with pytest.raises(ValueError, match="larger than the window 3"):
            RPTForCausalLM.from_pretrained(tmp_path, window=4)
        # the checkpoint is a plain HF model computing the RPT model's NTP logits (tests/checkpoint/test_faithful.py)
        plain = AutoModelForCausalLM.from_pretrained(tmp_path)
        assert (plain(x).logits - model(x).logits).abs().max() < 1e-5


def test_plain_checkpoint_needs_window(tmp_path):
    base = tiny_llama()
    base.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="not an RPT checkpoint"):
        RPTForCausalLM.from_pretrained(tmp_path)
    wrapped = RPTForCausalLM.from_pretrained(tmp_path, window=2)
    x = torch.randint(0, 97, (1, 10))
    with torch.no_grad():
        assert (wrapped(x).logits - base(x).logits).abs().max() < 1e-5


def test_offsets_outside_table_rejected():
    model = RPTForCausalLM.from_base(tiny_llama(), window=2)
    x = torch.zeros(1, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="offset table"):
        model(x, offset_ids=torch.full((1, 5), 3))
    with pytest.raises(ValueError, match="window must be"):
        RPTForCausalLM.from_base(tiny_llama(), window=1)


def test_gradient_checkpointing_gives_same_loss_and_grads():
    x = torch.randint(0, 97, (2, 21), generator=torch.Generator().manual_seed(6))
    b = make_rpt_batch(x, window=3, s=1.0, q=0.3, generator=torch.Generator().manual_seed(2), num_inputs=20)
    grads = []
    for ckpt in (False, True):
        model = RPTForCausalLM.from_base(tiny_llama(), window=3)
        randomise_table(model)
        model.train()
        if ckpt:
            model.gradient_checkpointing_enable()
        out = model(b.input_ids, position_ids=b.position_ids, offset_ids=b.offset_ids, labels=b.labels, kinds=b.kinds)
        out.loss.backward()
        grads.append((out.loss.item(), model.offset_embedding.weight.grad.clone()))
    assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-6)
    assert torch.allclose(grads[0][1], grads[1][1], atol=1e-6)
    assert grads[0][1].abs().sum() > 0


def test_bf16_forward_and_backward():
    model = RPTForCausalLM.from_base(tiny_llama().to(torch.bfloat16), window=3)
    assert model.offset_embedding.weight.dtype == torch.bfloat16
    x = torch.randint(0, 97, (2, 17))
    b = make_rpt_batch(x, window=3, s=1.0, q=0.3, num_inputs=16)
    out = model(b.input_ids, position_ids=b.position_ids, offset_ids=b.offset_ids, labels=b.labels, kinds=b.kinds)
    out.loss.backward()
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss)
    assert model(b.input_ids, position_ids=b.position_ids, offset_ids=b.offset_ids).logits.dtype == torch.bfloat16
    assert model.offset_embedding.weight.grad is not None
