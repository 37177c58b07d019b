"""``model.generate(custom_generate=<checkpoint>, trust_remote_code=True)`` on the plain HF model is RPT sampling."""

import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from rpt.model import RPTForCausalLM
from rpt.sampling import SamplingConfig, generate
from tests.helpers.tiny_models import save_tiny_checkpoint, tiny_llama


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = save_tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), window=3, seed=1)
    plain = AutoModelForCausalLM.from_pretrained(path).eval()
    return path, plain, RPTForCausalLM.from_pretrained(path).eval()


def prompts(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(3, 250, (3, 9), generator=g)
    mask = torch.ones_like(x)
    mask[1, :3] = 0  # a shorter, left-padded row
    x[1, :3] = 0
    return x, mask


@pytest.mark.parametrize("rpt_iters", [0, 1])
@pytest.mark.parametrize("sampling", [dict(), dict(temperature=1.0, top_k=20, seed=7), dict(do_sample=True, seed=11)])
def test_custom_generate_equals_rpt_sampling(ckpt, rpt_iters, sampling):
    path, plain, rpt = ckpt
    assert os.path.isfile(os.path.join(path, "custom_generate", "generate.py"))
    x, mask = prompts()
    out = plain.generate(x, attention_mask=mask, custom_generate=path, trust_remote_code=True, rpt_iters=rpt_iters,
                         rpt_window=3, confidence=0.3, max_new_tokens=16, return_dict_in_generate=True, **sampling)
    fields = dict(sampling)
    if fields.pop("do_sample", False):
        fields["temperature"] = 1.0  # HF's do_sample=True means temperature 1
    ref = generate(rpt, x, SamplingConfig(max_new_tokens=16, rpt_iters=rpt_iters, rpt_window=3, confidence=0.3,
                                          eos_token_id=plain.generation_config.eos_token_id, **fields), mask)
    assert torch.equal(out.sequences, ref.sequences)
    if rpt_iters:  # the comparison covers real corrections, not only NTP
        assert out.stats["corrections"] > 0
    if rpt_iters and not sampling:  # without return_dict_in_generate: the sequences tensor, like HF
        plain_seq = plain.generate(x, attention_mask=mask, custom_generate=path, trust_remote_code=True,
                                   rpt_iters=rpt_iters, rpt_window=3, confidence=0.3, max_new_tokens=16)
        assert torch.equal(plain_seq, ref.sequences)


def test_k0_greedy_equals_transformers_greedy(ckpt):
    """An independent decoder: transformers' own greedy search on the same (faithful) weights."""
    path, plain, _ = ckpt
    x = prompts(3)[0][:1]
    ours = plain.generate(x, custom_generate=path, trust_remote_code=True, max_new_tokens=12)
    theirs = plain.generate(x, do_sample=False, max_new_tokens=12)
    assert torch.equal(ours, theirs)


def test_bad_keywords_and_missing_table_are_clear_errors(ckpt, tmp_path):
    path, plain, _ = ckpt
    x = prompts()[0][:1]
    with pytest.raises(ValueError, match=r"does not take \['num_beams'\]"):
        plain.generate(x, custom_generate=path, trust_remote_code=True, num_beams=4)
    from transformers import GenerationConfig

    with pytest.raises(ValueError, match=r"does not take \['generation_config'\]"):
        plain.generate(x, custom_generate=path, trust_remote_code=True, generation_config=GenerationConfig(max_new_tokens=3))
    with pytest.raises(ValueError, match="SamplingConfig.confidence"):
        plain.generate(x, custom_generate=path, trust_remote_code=True, rpt_iters=1, confidence=2.0)
    base = tiny_llama(vocab_size=300)
    base.save_pretrained(tmp_path)
    base = AutoModelForCausalLM.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="needs the offset table"):
        base.generate(x, custom_generate=path, trust_remote_code=True, rpt_iters=1)


def test_right_padded_prompts_are_refused_with_the_tokenizer_setting_that_fixes_them(ckpt):
    """A right-padded batch (HF tokenizers' default padding side) is one error that names the fix."""
    path, plain, _ = ckpt
    x, mask = prompts()
    mask[1] = torch.tensor([1] * 6 + [0] * 3)  # row 1 padded on the right
    with pytest.raises(ValueError, match=r'left-padded.*padding_side = "left"'):
        plain.generate(x, attention_mask=mask, custom_generate=path, trust_remote_code=True, max_new_tokens=4)


def test_a_missing_rpt_checkpoint_is_named_not_read_as_a_repo_id(tmp_path):
    from rpt.hf_generate import rpt_model_for

    with pytest.raises(ValueError, match="rpt_checkpoint .* does not exist") as e:
        rpt_model_for(tiny_llama(), str(tmp_path / "runs" / "missing" / "final"), rpt_iters=1)
    assert "Repo id must be" not in str(e.value)
