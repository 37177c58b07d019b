"""Every architecture family RPT claims, on a tiny random config each (``tests/helpers/arch_zoo.py``): it either
holds all four guarantees or is refused when it is wrapped, in one line naming it and why.

1. wrapped with a zero table, the model is the base model (plain and identity-permuted inputs);
2. a training step on a permuted-window batch is finite, its loss is the cross-entropy of the model's
   own logits (the family's logit scaling / soft-capping handled), and the positions reach the model;
3. the fast decoder equals the cache-free reference at ``rpt_iters=1``, greedy (float64), on a decode
   that is not one repeated token;
4. after a save, plain ``AutoModelForCausalLM`` computes the trained RPT model's next-token logits
   (float32), and the reloaded RPT model its previous-token ones.

A representative subset runs by default; the whole zoo is ``slow``, and so is ``train.py`` training
each family two steps from a from-config spec.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from rpt.model import RPTForCausalLM
from rpt.model.architectures import TESTED_FAMILIES, UnsupportedArchitecture
from rpt.model.objective import make_rpt_batch, ntp_batch
from rpt.sampling.config import SamplingConfig
from rpt.sampling.decode.generate import generate
from rpt.sampling.reference import generate_reference
from rpt.training.measure.metrics import read_metrics
from tests.helpers.arch_zoo import ALIBI, VOCAB, ZOO, tiny_model
from tests.helpers.inprocess_train import one_error_line, train_main
from tests.helpers.train_helpers import write_config

WRAPPED = [name for name in ZOO if name not in ALIBI]
# the default suite: a RoPE model, Gemma's scaled tied embedding, learned absolute positions
FAST = ("llama", "gemma", "gpt2")
FAMILIES = [pytest.param(n, marks=() if n in FAST else pytest.mark.slow) for n in WRAPPED]


def tokens(shape, seed: int) -> torch.Tensor:
    return torch.randint(3, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def check_wrap_equals_base(base, model: RPTForCausalLM, x: torch.Tensor) -> float:
    """The wrapped model's logits against the base model's; returns the max difference."""
    b = ntp_batch(x)
    with torch.no_grad():
        ref = base(x).logits
        plain = model(x).logits
        identity = model(b.input_ids, position_ids=b.position_ids, offset_ids=b.offset_ids).logits
    diff = max((plain - ref).abs().max().item(), (identity - ref).abs().max().item())
    assert diff <= 1e-5
    return diff


def check_training_step(model: RPTForCausalLM, x: torch.Tensor):
    """One AdamW step on a permuted-window batch; returns the batch."""
    b = make_rpt_batch(x, window=3, s=1.0, q=0.3, generator=torch.Generator().manual_seed(0), num_inputs=x.shape[1] - 1)
    kw = dict(position_ids=b.position_ids, offset_ids=b.offset_ids)
    model.train()
    out = model(b.input_ids, labels=b.labels, kinds=b.kinds, **kw)
    assert torch.isfinite(out.loss) and (b.kinds > 0).any()
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert model.offset_embedding.weight.grad[1:].abs().sum() > 0  # the PTP rows learn
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt.step()
    model.eval()
    with torch.no_grad():
        logits = model(b.input_ids, **kw).logits
        again = model(b.input_ids, labels=b.labels, kinds=b.kinds, **kw).loss
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), b.labels.reshape(-1))
        assert torch.isfinite(again) and again.item() == pytest.approx(ce.item(), rel=1e-5)
        # the permuted window's positions reach the model: the same tokens at other positions differ
        shuffled = b.position_ids.clone()
        shuffled[:, 1:] = shuffled[:, 1:].flip(-1)
        moved = model(b.input_ids, position_ids=shuffled, offset_ids=b.offset_ids).logits
        assert (moved - logits).abs().max() > 1e-3
    return b


def check_faithful_save(model: RPTForCausalLM, x: torch.Tensor, batch, path) -> float:
    """Plain transformers' logits of the saved checkpoint against RPT's NTP logits; returns the max difference."""
    kw = dict(position_ids=batch.position_ids, offset_ids=batch.offset_ids)
    with torch.no_grad():
        ntp, ptp = model(x).logits, model(batch.input_ids, **kw).logits
        model.save_pretrained(path)
        plain = AutoModelForCausalLM.from_pretrained(path).eval()
        diff = (plain(x).logits - ntp).abs().max().item()
        assert diff <= 1e-4 * max(1.0, ntp.abs().max().item())
        loaded = RPTForCausalLM.from_pretrained(path).eval()
        assert (loaded(batch.input_ids, **kw).logits - ptp).abs().max() <= 1e-4
    return diff


def check_fast_equals_reference(model: RPTForCausalLM) -> tuple[int, int]:
    """Returns the corrections and the most distinct tokens a row generated."""
    model = model.double()
    model.lm.generation_config.eos_token_id = None  # a random model has no real EOS: run to max_new_tokens
    ids = tokens((2, 7), 5)
    mask = torch.ones_like(ids)
    ids[1, :2], mask[1, :2] = 0, 0  # rows of different lengths, left-padded
    cfg = SamplingConfig(max_new_tokens=8, rpt_iters=1, rpt_window=3, confidence=0.0)
    fast = generate(model, ids, cfg, attention_mask=mask)
    ref = generate_reference(model, ids, cfg, attention_mask=mask)
    assert torch.equal(fast.sequences, ref.sequences)
    assert fast.stats["corrections"] == ref.stats["corrections"] > 0  # RPT moved tokens: PTP was read
    distinct = max(len(set(row[7:].tolist())) for row in ref.sequences)
    assert distinct > 1  # not one repeated token
    return ref.stats["corrections"], distinct


@pytest.mark.parametrize("name", FAMILIES)
def test_family_holds_every_guarantee(tmp_path, name):
    base = tiny_model(name)
    model = RPTForCausalLM.from_base(base, window=3)
    x = tokens((2, 20), 1)
    check_wrap_equals_base(base, model, x)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():  # a trained-looking table: row 0 (the folded NTP row) far from zero
        model.offset_embedding.weight.copy_(0.5 * torch.randn(model.offset_embedding.weight.shape, generator=g))
    batch = check_training_step(model, x)
    check_faithful_save(model, x, batch, tmp_path)
    check_fast_equals_reference(model)


def test_the_zoo_is_every_tested_family_and_the_docs_name_each():
    """rpt.model.architectures.TESTED_FAMILIES is what this file checks, and what the README and science.md list."""
    from tests.helpers.scripts import ROOT

    assert sorted(TESTED_FAMILIES) == sorted({ZOO[n][0] for n in WRAPPED})
    for doc in ("README.md", "docs/science.md"):
        text = " ".join((ROOT / doc).read_text().split())
        assert [name for name in TESTED_FAMILIES.values() if name.split(" (")[0] not in text] == [], doc


@pytest.mark.parametrize("name", ALIBI)
def test_alibi_models_are_refused_in_one_line(name):
    base = tiny_model(name)
    with pytest.raises(UnsupportedArchitecture) as info:
        RPTForCausalLM.from_base(base, window=3)
    message = str(info.value)
    assert "\n" not in message and type(base).__name__ in message and "ALiBi" in message and "position" in message


@pytest.mark.parametrize("name", ALIBI)
def test_the_fast_decoder_refuses_a_plain_alibi_model_in_one_line(name):
    """Plain NTP decoding (rpt_iters=0) feeds position ids and a position-addressed cache too: BLOOM
    and Falcon-ALiBi died in an unpacking error there; every ALiBi model is one ValueError instead."""
    base = tiny_model(name)
    with pytest.raises(ValueError) as info:
        generate(base, tokens((1, 5), 3), SamplingConfig(max_new_tokens=4))
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{type(base).__name__} is an ALiBi model")
    assert "transformers' generate" in message


@pytest.mark.slow  # 3 s; the decoder's refusal it prints is in the default suite above
def test_sample_py_refuses_a_plain_alibi_checkpoint_in_one_line(tmp_path, capsys):
    import sample
    from tests.helpers.tiny_models import tiny_tokenizer

    tiny_model("bloom").save_pretrained(tmp_path / "bloom")
    tiny_tokenizer().save_pretrained(tmp_path / "bloom")
    code = sample.main(["--checkpoint", str(tmp_path / "bloom"), "--prompt", "def f", "--rpt-iters", "0",
                        "--max-new-tokens", "4"])
    assert code == 2
    assert "BloomForCausalLM is an ALiBi model" in one_error_line(capsys.readouterr().err)


def test_a_forward_without_position_ids_is_refused_even_without_an_alibi_flag():
    """The rule is the forward's signature, not a list of names: MPT with ``alibi`` off takes no position ids either."""
    from rpt.model.architectures import architecture_refusal, causal_lm_class
    from tests.helpers.arch_zoo import tiny_config

    config = tiny_config("mpt")
    config.attn_config.alibi = False
    reason = architecture_refusal(config, causal_lm_class(config))
    assert reason is not None and reason.startswith("MptForCausalLM takes no position_ids")
    assert architecture_refusal(tiny_config("falcon"), causal_lm_class(tiny_config("falcon"))) is None


def test_an_embedding_that_is_not_a_scaled_lookup_is_refused():
    """The fold is exact only for ``weight[ids] * c``; an embedding that adds anything else is refused."""
    from tests.helpers.tiny_models import tiny_llama

    class Shifted(torch.nn.Embedding):
        def forward(self, ids):
            return super().forward(ids) + 1.0

    base = tiny_llama()
    shifted = Shifted(VOCAB, 32)
    shifted.weight.data.copy_(base.get_input_embeddings().weight.data)
    base.set_input_embeddings(shifted)
    with pytest.raises(UnsupportedArchitecture, match=r"LlamaForCausalLM's input embedding \(Shifted\) is not a row lookup"):
        RPTForCausalLM.from_base(base, window=3)


@pytest.mark.parametrize("source", ["spec", "directory"])
def test_train_refuses_an_alibi_model_before_any_work(tmp_path, capsys, source):
    if source == "spec":
        model = {"model_type": "bloom", "hidden_size": 32, "n_layer": 2, "n_head": 4}
    else:
        tiny_model("bloom").save_pretrained(tmp_path / "bloom")
        model = str(tmp_path / "bloom")
    config = write_config(tmp_path, model=model, tokenizer={"train_bpe": {"vocab_size": 300}})
    assert train_main(config) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "config key 'model'" in line and "BloomForCausalLM is an ALiBi model" in line
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()  # refused before any work


@pytest.mark.slow
@pytest.mark.parametrize("name", WRAPPED)
def test_train_py_trains_every_family(tmp_path, name):
    """The trainer's own path (from-config build, FLOPs count, evaluation, save) on each family."""
    model_type, kwargs = ZOO[name]
    config = write_config(tmp_path, model={"model_type": model_type, **kwargs}, max_steps=2, warmup_steps=1,
                          eval_every=2, save_every=2, eval_batches=1)
    assert train_main(config) == 0
    last = read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]
    assert last["step"] == 2 and math.isfinite(last["loss"]) and math.isfinite(last["eval_loss"])
    assert (tmp_path / "run" / "final" / "rpt_config.json").is_file()
