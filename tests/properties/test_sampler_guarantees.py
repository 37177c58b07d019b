"""What ``generate`` promises beside token equality: seeds that share no draws, HF's default EOS,
sliding-window models, NaN logits refused, a row's budget its own.

Each check compares against an independent truth: the uncached reference decoder, the same row
decoded alone, or a hand-built case (a NaN planted in the head, a prompt at the context limit).
"""

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM

from rpt.model import RPTForCausalLM
from rpt.sampling import SamplingConfig, generate, generate_reference
from rpt.sampling.randomness import row_seed, row_seeds
from tests.helpers.tiny_models import tiny_llama, tiny_tokenizer
from tests.sampling.decode.test_decoder import V, prompts, rpt_model


@pytest.fixture(scope="module")
def model():
    return rpt_model(2)


# ---- seeds -----------------------------------------------------------------------------------------
def test_row_seeds_of_adjacent_seeds_are_disjoint():
    """``seed + b`` made run 1's rows 0..6 run 0's rows 1..7; hashed, 100 runs of 64 rows share none."""
    seen = [s for seed in range(100) for s in row_seeds(seed, 64)]
    assert len(set(seen)) == len(seen)
    assert row_seeds(3, 4) == [row_seed(3, b) for b in range(4)] and row_seed(3, 0) != 3
    assert all(0 <= s < 2**62 for s in seen[:50]) and row_seed(-1, 0) != row_seed(0, 0)


def test_runs_with_seeds_0_and_1_share_no_sample(model):
    """8 samples of one prompt under seed 0 and under seed 1: 16 different continuations."""
    ids = prompts(1, seed=20)[0].expand(8, -1).contiguous()
    cfg = dict(max_new_tokens=8, temperature=1.0, rpt_iters=1, rpt_window=2, confidence=0.3, ptp_greedy=False)
    runs = [generate(model, ids, SamplingConfig(**cfg, seed=s)) for s in (0, 1)]
    samples = [tuple(r.generated(b)) for r in runs for b in range(8)]
    assert len(set(samples)) == 16


# ---- EOS from the tokenizer / generation_config ----------------------------------------------------
def test_eos_defaults_to_the_tokenizers_and_the_models():
    tok = tiny_tokenizer()
    base = tiny_llama(vocab_size=len(tok), initializer_range=0.4)
    base.generation_config.eos_token_id = None
    model = RPTForCausalLM.from_base(base, window=2).eval()
    ids = torch.tensor([tok("def add(a, b):")["input_ids"]])
    free = generate(model, ids, SamplingConfig(max_new_tokens=24, eos_token_id=[]))
    stop = free.generated(0)[5]  # a token the greedy decode reaches: make it the tokenizer's EOS
    first = free.generated(0).index(stop)
    tok.eos_token = tok.convert_ids_to_tokens(stop)
    for decode in (generate, generate_reference):
        out = decode(model, ids, SamplingConfig(max_new_tokens=24), tokenizer=tok)
        assert out.finish_reasons == ["eos"] and out.generated(0) == free.generated(0)[: first + 1]
    # the model's generation_config counts too (HF generate stops there), and [] turns EOS off
    base.generation_config.eos_token_id = stop
    assert generate(model, ids, SamplingConfig(max_new_tokens=24)).finish_reasons == ["eos"]
    assert generate(model, ids, SamplingConfig(max_new_tokens=24, eos_token_id=[]), tokenizer=tok
                    ).generated(0) == free.generated(0)
    assert SamplingConfig(eos_token_id=7).with_default_eos(model, tok).eos_token_ids == [7]


# ---- sliding-window layers ------------------------------------------------------------------------
def mistral(sliding_window: int) -> RPTForCausalLM:
    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.4,
                        sliding_window=sliding_window)
    cfg._attn_implementation = "sdpa"
    model = RPTForCausalLM.from_base(MistralForCausalLM(cfg), window=3).double().eval()
    with torch.no_grad():
        model.offset_embedding.weight.copy_(0.3 * torch.randn(model.offset_embedding.weight.shape, dtype=torch.float64))
    model.lm.generation_config.eos_token_id = None
    return model


def test_sliding_window_model_decodes_when_the_window_covers_the_call():
    ids, mask = prompts(3, seed=21)
    cfg = SamplingConfig(max_new_tokens=12, rpt_iters=2, rpt_window=3, confidence=0.0, eos_token_id=[])
    model = mistral(4096)
    fast, ref = generate(model, ids, cfg, attention_mask=mask), generate_reference(model, ids, cfg, attention_mask=mask)
    assert torch.equal(fast.sequences, ref.sequences) and fast.stats["corrections"] > 0
    assert fast.stats["forward_passes"] < ref.stats["forward_passes"]  # the cached decoder, not a fallback
    with pytest.raises(ValueError, match=r"sliding window is 8 tokens.*max_new_tokens"):
        generate(mistral(8), ids, cfg, attention_mask=mask)


# ---- NaN / inf logits -----------------------------------------------------------------------------
@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_nan_or_inf_logits_raise(poison):
    model = rpt_model(2)
    with torch.no_grad():
        model.lm.lm_head.weight[7, 0] = poison  # the logit of token 7 becomes NaN / +-inf
    ids, mask = prompts(2, seed=22)
    for decode in (generate, generate_reference):
        for cfg in (SamplingConfig(max_new_tokens=4), SamplingConfig(max_new_tokens=4, temperature=1.0, rpt_iters=1)):
            with pytest.raises(ValueError, match="NaN or inf"):
                decode(model, ids, cfg, attention_mask=mask)


# ---- a row's budget is its own --------------------------------------------------------------------
def test_a_rows_budget_does_not_depend_on_its_neighbours(model):
    """Context 256: a 1-token prompt beside a 240-token one still gets its 30 tokens (the long one 16),
    and its tokens are those it gets alone; the warning names the caller, in both decoders."""
    short = torch.tensor([[5]])
    long = torch.randint(0, V, (1, 240), generator=torch.Generator().manual_seed(23))
    ids = torch.cat([torch.cat([torch.zeros(1, 239, dtype=torch.long), short], 1), long])
    mask = torch.cat([torch.cat([torch.zeros(1, 239), torch.ones(1, 1)], 1), torch.ones(1, 240)]).long()
    cfg = SamplingConfig(max_new_tokens=30, rpt_iters=1, rpt_window=2, confidence=0.0, eos_token_id=[])
    alone = generate(model, short, cfg)
    for decode in (generate, generate_reference):
        with pytest.warns(UserWarning, match=r"rows \[1\] generate at most \[16\]") as caught:
            out = decode(model, ids, cfg, attention_mask=mask)
        assert caught[0].filename == __file__  # the warning names the line that called the decoder
        assert out.new_token_counts == [30, 16]
        assert out.generated(0) == alone.generated(0)
