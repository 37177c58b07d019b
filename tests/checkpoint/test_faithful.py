"""Faithful HF weights: plain transformers loads exactly the trained RPT model's NTP predictor."""

import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from rpt.model import RPTForCausalLM
from rpt.model.objective import make_rpt_batch
from rpt.model.wrapper import LEGACY_TABLE_NAME, RPT_CONFIG_NAME, RPT_TABLE_NAME
from tests.helpers.tiny_models import tiny_gpt2, tiny_llama

BASES = {
    "gpt2-tied": lambda: tiny_gpt2(),
    "llama-tied": lambda: tiny_llama(tie_word_embeddings=True),
    "llama-untied": lambda: tiny_llama(),
}


def rpt_model(arch: str, seed: int = 0) -> RPTForCausalLM:
    model = RPTForCausalLM.from_base(BASES[arch](), window=3)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # a large table: without the fold, plain logits differ by O(1)
        model.offset_embedding.weight.copy_(torch.randn(model.offset_embedding.weight.shape, generator=g))
    return model


def ptp_inputs(seed: int = 1):
    x = torch.randint(0, 97, (2, 32), generator=torch.Generator().manual_seed(seed))
    b = make_rpt_batch(x, window=3, s=1.0, q=0.4, generator=torch.Generator().manual_seed(seed))
    return x, b.input_ids, dict(position_ids=b.position_ids, offset_ids=b.offset_ids)


@pytest.mark.parametrize("arch", list(BASES))
def test_plain_transformers_equals_rpt_ntp(tmp_path, arch):
    model = rpt_model(arch)
    tied_before = model.lm.get_output_embeddings().weight is model.lm.get_input_embeddings().weight
    x, ids, kw = ptp_inputs()
    with torch.no_grad():
        ntp, ptp = model(x).logits, model(ids, **kw).logits
        # the premise: the unfolded base weights are a different model
        assert (model.lm(x).logits - ntp).abs().max() > 0.1
        model.save_pretrained(tmp_path)
        plain = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
        assert (plain(x).logits - ntp).abs().max() <= 1e-4
        # greedy generate on the plain model is the RPT model's greedy NTP continuation
        out = plain.generate(x[:1, :8], max_new_tokens=6, do_sample=False, pad_token_id=0)
        seq = x[:1, :8]
        for _ in range(6):
            seq = torch.cat([seq, model(seq).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        assert torch.equal(out, seq)
        # RPT (every offset row) is unchanged after the round trip
        loaded = RPTForCausalLM.from_pretrained(tmp_path)
        assert (loaded(ids, **kw).logits - ptp).abs().max() <= 1e-5
        assert (loaded(x).logits - ntp).abs().max() <= 1e-5
    # the in-memory model is untouched; the saved one is untied only when it had to be
    assert (model.lm.get_output_embeddings().weight is model.lm.get_input_embeddings().weight) == tied_before
    assert plain.config.tie_word_embeddings is False
    saved = json.loads((tmp_path / RPT_CONFIG_NAME).read_text())
    assert saved["format_version"] == 2 and saved["untied_embeddings"] == tied_before
    if tied_before:  # tied again on load, with the absolute table: the trained model bit for bit
        assert loaded.lm.get_output_embeddings().weight is loaded.lm.get_input_embeddings().weight
        assert torch.equal(loaded.offset_embedding.weight, model.offset_embedding.weight)
        assert torch.equal(loaded.lm.get_input_embeddings().weight, model.lm.get_input_embeddings().weight)
    else:
        assert loaded.offset_embedding.weight[0].abs().max() == 0  # the table is relative to the folded row


@pytest.mark.parametrize("arch", ["gpt2-tied", "llama-tied"])
def test_a_fine_tune_from_a_saved_tied_model_equals_one_from_the_model_in_memory(tmp_path, arch):
    """init_from a tied checkpoint trains one shared matrix, as the original run did: two AdamW
    steps from the loaded model give bit for bit the parameters of two steps from the original."""
    model = rpt_model(arch)
    model.save_pretrained(tmp_path)
    loaded = RPTForCausalLM.from_pretrained(tmp_path)
    _, ids, kw = ptp_inputs(4)
    labels = torch.randint(0, 97, ids.shape, generator=torch.Generator().manual_seed(4))
    for m in (model, loaded):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)
        for _ in range(2):
            opt.zero_grad()
            m(ids, labels=labels, **kw).loss.backward()
            opt.step()
    assert sum(1 for _ in loaded.parameters()) == sum(1 for _ in model.parameters())
    for (name, a), b in zip(model.named_parameters(), loaded.parameters()):
        assert torch.equal(a, b), name


def test_format_version_1_checkpoint_still_loads(tmp_path):
    """A checkpoint as written before the fold: unfolded base weights and the absolute table."""
    model = rpt_model("llama-untied", seed=3)
    model.lm.save_pretrained(tmp_path)
    # the table at the top level, where checkpoints kept it before rpt_table/
    save_file({"offset_embedding.weight": model.offset_embedding.weight.detach().clone()}, str(tmp_path / LEGACY_TABLE_NAME))
    (tmp_path / RPT_CONFIG_NAME).write_text(json.dumps({"window": 3, "offset_rows": ["+1", "-1", "-2", "+3"]}))
    x, ids, kw = ptp_inputs(2)
    with torch.no_grad():
        loaded = RPTForCausalLM.from_pretrained(tmp_path)
        assert (loaded(ids, **kw).logits - model(ids, **kw).logits).abs().max() <= 1e-6
        assert (loaded(x).logits - model(x).logits).abs().max() <= 1e-6
        # re-saving upgrades it to the faithful format
        loaded.save_pretrained(tmp_path / "v2")
        plain = AutoModelForCausalLM.from_pretrained(tmp_path / "v2")
        assert (plain(x).logits - model(x).logits).abs().max() <= 1e-4


@pytest.mark.parametrize("arch", ["llama-tied", "llama-untied"])
def test_top_level_safetensors_hold_only_the_plain_models_weights(tmp_path, arch):
    """What vLLM, SGLang and TGI read: every top-level *.safetensors, each tensor of which must be a
    parameter of the plain architecture (vLLM refuses any other); the table sits in a subfolder."""
    from safetensors import safe_open

    rpt_model(arch).save_pretrained(tmp_path)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path)
    names = set()
    for f in tmp_path.glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            names |= set(st.keys())
    assert names == set(plain.state_dict())
    assert (tmp_path / RPT_TABLE_NAME).is_file() and not (tmp_path / LEGACY_TABLE_NAME).exists()


def test_a_faithful_checkpoint_with_the_table_at_the_top_level_loads_and_resaves_without_it(tmp_path):
    """Version-2 checkpoints written before rpt_table/ keep the table at the top level."""
    model = rpt_model("llama-tied", seed=6)
    model.save_pretrained(tmp_path)
    (tmp_path / RPT_TABLE_NAME).rename(tmp_path / LEGACY_TABLE_NAME)
    (tmp_path / RPT_TABLE_NAME).parent.rmdir()
    x, ids, kw = ptp_inputs(3)
    with torch.no_grad():
        loaded = RPTForCausalLM.from_pretrained(tmp_path)
        assert torch.equal(loaded(ids, **kw).logits, model(ids, **kw).logits)
        loaded.save_pretrained(tmp_path)  # over itself: the top-level copy goes
    assert (tmp_path / RPT_TABLE_NAME).is_file() and not (tmp_path / LEGACY_TABLE_NAME).exists()
    with torch.no_grad():
        assert torch.equal(RPTForCausalLM.from_pretrained(tmp_path)(ids, **kw).logits, model(ids, **kw).logits)


def test_a_checkpoint_without_its_table_is_one_clear_error(tmp_path):
    rpt_model("llama-untied").save_pretrained(tmp_path)
    (tmp_path / RPT_TABLE_NAME).unlink()
    with pytest.raises(FileNotFoundError, match="no offset table.*copy the whole checkpoint directory"):
        RPTForCausalLM.from_pretrained(tmp_path)


def test_unknown_format_version_is_one_clear_error(tmp_path):
    rpt_model("llama-untied").save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / RPT_CONFIG_NAME).read_text())
    (tmp_path / RPT_CONFIG_NAME).write_text(json.dumps({**cfg, "format_version": 9}))
    with pytest.raises(ValueError, match="format version 9.*upgrade rpt"):
        RPTForCausalLM.from_pretrained(tmp_path)


def test_fine_tuning_a_faithful_checkpoint_stays_faithful(tmp_path):
    """init_from a folded checkpoint (row 0 of its table is zero), train, save again: the second
    fold adds the newly learned row on top of the first; plain transformers still equals RPT NTP."""
    rpt_model("gpt2-tied").save_pretrained(tmp_path / "ar")
    model = RPTForCausalLM.from_pretrained(tmp_path / "ar")
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # as if fine-tuned: every weight and the whole table move
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    x, ids, kw = ptp_inputs(3)
    with torch.no_grad():
        ntp, ptp = model(x).logits, model(ids, **kw).logits
        model.save_pretrained(tmp_path / "rpt")
        assert (AutoModelForCausalLM.from_pretrained(tmp_path / "rpt")(x).logits - ntp).abs().max() <= 1e-4
        assert (RPTForCausalLM.from_pretrained(tmp_path / "rpt")(ids, **kw).logits - ptp).abs().max() <= 1e-5
