"""Repetition, frequency and presence penalties; warpers; the order of the built list."""

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from rpt.sampling import (
    FrequencyPresencePenaltyLogitsProcessor,
    LZPenaltyLogitsProcessor,
    SamplingConfig,
    build_logits_processors,
    lz_penalty,
    penalty_processors,
)
from tests.helpers.tiny_models import tiny_llama

INF = float("inf")


def test_frequency_presence_hand_computed():
    # prompt [1, 1] is not counted; generated [2, 2, 3]: n_2 = 2, n_3 = 1
    ids = torch.tensor([[1, 1, 2, 2, 3]])
    scores = torch.tensor([[1.0, -1.0, 0.5, -2.0, 3.0]])
    got = FrequencyPresencePenaltyLogitsProcessor(0.5, 0.25, prompt_length=2)(ids, scores)
    want = torch.tensor([[1.0, -1.0, 0.5 - 1.0 - 0.25, -2.0 - 0.5 - 0.25, 3.0]])
    torch.testing.assert_close(got, want)
    assert torch.equal(scores, torch.tensor([[1.0, -1.0, 0.5, -2.0, 3.0]]))  # out of place
    # negative penalties encourage repeats
    got = FrequencyPresencePenaltyLogitsProcessor(-1.0, -2.0, prompt_length=2)(ids, scores)
    torch.testing.assert_close(got, torch.tensor([[1.0, -1.0, 0.5 + 2 + 2, -2.0 + 1 + 2, 3.0]]))


def test_frequency_presence_per_row_prompt_lengths():
    ids = torch.tensor([[0, 0, 1, 1], [0, 0, 1, 1]])
    scores = torch.zeros(2, 3)
    got = FrequencyPresencePenaltyLogitsProcessor(1.0, 0.5, prompt_length=torch.tensor([0, 3]))(ids, scores)
    torch.testing.assert_close(got, torch.tensor([[-2.5, -2.5, 0.0], [0.0, -1.5, 0.0]]))
    # nothing generated yet: nothing to penalise
    assert torch.equal(FrequencyPresencePenaltyLogitsProcessor(1.0, 1.0, prompt_length=4)(ids, scores), scores)


def test_frequency_presence_bad_values():
    with pytest.raises(ValueError, match="frequency_penalty"):
        FrequencyPresencePenaltyLogitsProcessor(2.5, 0.0)
    with pytest.raises(ValueError, match="presence_penalty"):
        FrequencyPresencePenaltyLogitsProcessor(0.0, -3.0)
    with pytest.raises(ValueError, match="prompt_length"):
        FrequencyPresencePenaltyLogitsProcessor(1.0, 0.0, prompt_length=-2)


def test_repetition_penalty_hand_computed_and_hf():
    ids = torch.tensor([[0, 1, 1]])
    scores = torch.tensor([[2.0, -2.0, 1.0, -0.5]])
    procs = penalty_processors(SamplingConfig(repetition_penalty=2.0))
    assert len(procs) == 1 and isinstance(procs[0], RepetitionPenaltyLogitsProcessor)
    got = procs(ids, scores)
    # CTRL form: positive logits divided, negative multiplied (both lower the token)
    torch.testing.assert_close(got, torch.tensor([[1.0, -4.0, 1.0, -0.5]]))
    torch.testing.assert_close(got, RepetitionPenaltyLogitsProcessor(2.0)(ids, scores))
    # left padding (id 3 here) is excluded when the caller says where it is
    padded = torch.tensor([[3, 3, 0, 1], [3, 0, 1, 1]])
    procs = penalty_processors(SamplingConfig(repetition_penalty=2.0), pad_length=torch.tensor([2, 1]))
    got = procs(padded, scores.repeat(2, 1))
    torch.testing.assert_close(got, torch.tensor([[1.0, -4.0, 1.0, -0.5]]).repeat(2, 1))


def test_lz_window_prompt_or_generated_only():
    ids = torch.tensor([[7, 7, 7, 7, 1, 2, 1, 2], [9, 7, 7, 7, 1, 2, 1, 2]])
    scores = torch.zeros(2, 10)
    cfg = SamplingConfig(lz_penalty=1.0, lz_window=64, lz_buffer=8)
    got = penalty_processors(cfg, prompt_length=4)(ids, scores.clone())  # in place: a fresh copy
    torch.testing.assert_close(got, -lz_penalty(ids[:, 4:], 10, 64, 8))
    assert got[0, 7] == 0  # prompt tokens are outside the default window
    cfg.lz_include_prompt = True
    got = penalty_processors(cfg, prompt_length=4, pad_length=torch.tensor([0, 1]))(ids, scores.clone())
    torch.testing.assert_close(got[0], -lz_penalty(ids[0], 10, 64, 8))
    torch.testing.assert_close(got[1], -lz_penalty(ids[1, 1:], 10, 64, 8))


def kinds(procs) -> list[type]:
    return [type(p) for p in procs]


def test_build_order_and_switches():
    healing = LZPenaltyLogitsProcessor(0.0)  # any processor stands in for the healing one here
    cfg = SamplingConfig(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, repetition_penalty=1.2,
                         frequency_penalty=0.1, presence_penalty=0.2, lz_penalty=0.15)
    procs = build_logits_processors(cfg, prompt_length=3, healing=healing)
    assert procs[0] is healing
    assert kinds(procs[1:]) == [RepetitionPenaltyLogitsProcessor, FrequencyPresencePenaltyLogitsProcessor,
                                LZPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper,
                                TopPLogitsWarper, MinPLogitsWarper]
    assert kinds(build_logits_processors(cfg, 3, include_warpers=False)) == kinds(procs[1:4])
    cfg.temperature = 0.0  # greedy: penalties only
    assert kinds(build_logits_processors(cfg, 3)) == kinds(procs[1:4])
    assert len(build_logits_processors(SamplingConfig())) == 0  # defaults: plain greedy
    assert kinds(build_logits_processors(SamplingConfig(temperature=1.0, top_k=3))) == [TopKLogitsWarper]


def test_build_applies_penalties_then_temperature_then_topk_then_topp():
    ids = torch.tensor([[0, 1, 2, 2]])
    scores = torch.tensor([[4.0, 3.0, 2.9, 1.0, -1.0, 0.5]])
    cfg = SamplingConfig(temperature=0.5, top_k=4, top_p=0.8, frequency_penalty=1.0)
    got = build_logits_processors(cfg, prompt_length=1)(ids, scores)
    # by hand: penalties (n_1 = 1, n_2 = 2) -> / 0.5 -> keep top 4 -> keep the top-p nucleus
    x = scores - torch.tensor([[0.0, 1.0, 2.0, 0.0, 0.0, 0.0]])
    x = x / 0.5  # [8, 4, 1.8, 2, -2, 1]
    x[0, [4, 5]] = -INF  # top-4 keeps 8, 4, 2, 1.8
    p = torch.softmax(x, -1)  # 0.976, 0.018, ...: 8 alone covers 0.8 of the mass
    assert p[0, 0] > 0.8
    want = torch.full_like(x, -INF)
    want[0, 0] = 8.0
    torch.testing.assert_close(got, want)
    # the order matters: top-p before temperature keeps more tokens
    swapped = LogitsProcessorList([FrequencyPresencePenaltyLogitsProcessor(1.0, 0.0, 1), TopPLogitsWarper(0.8),
                                   TemperatureLogitsWarper(0.5)])(ids, scores)
    assert torch.isfinite(swapped).sum() > 1


def test_penalised_greedy_generate_matches_manual_loop():
    model = tiny_llama(vocab_size=50, seed=2)
    model.generation_config.eos_token_id = None  # run every step, like the manual loop
    prompt = torch.randint(0, 50, (2, 4), generator=torch.Generator().manual_seed(1))
    cfg = SamplingConfig(repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.5, lz_penalty=0.5,
                         lz_window=16, lz_buffer=4, max_new_tokens=16)
    procs = build_logits_processors(cfg, prompt_length=4)
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), logits_processor=procs,
                         max_new_tokens=16, do_sample=False, pad_token_id=0)
    ids = prompt
    for _ in range(16):
        with torch.no_grad():
            logits = model(ids).logits[:, -1].float()
        ids = torch.cat([ids, procs(ids, logits).argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, ids)
    plain = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16, do_sample=False,
                           pad_token_id=0)
    assert not torch.equal(out, plain)


def test_build_rejects_bad_columns():
    with pytest.raises(ValueError, match="prompt_length"):
        build_logits_processors(SamplingConfig(), prompt_length=-1)
    with pytest.raises(ValueError, match="pad_length"):
        build_logits_processors(SamplingConfig(), pad_length=torch.zeros(2, 2, dtype=torch.long))


def test_lz_edits_logits_in_place_unless_told_not_to():
    ids = torch.tensor([[0, 1, 2, 1, 2]])
    scores = torch.randn(1, 6, generator=torch.Generator().manual_seed(0))
    keep = scores.clone()
    lz_only = SamplingConfig(lz_penalty=1.0)
    # the default: in place, as HF generate hands processors a copy of the model's logits
    out = build_logits_processors(lz_only, prompt_length=1)(ids, scores)
    assert out is scores and not torch.equal(out, keep)
    scores = keep.clone()
    kept = build_logits_processors(lz_only, prompt_length=1, inplace=False)(ids, scores)
    assert torch.equal(scores, keep) and torch.equal(kept, out)
    # with a penalty before it, the LZ processor works in place on that penalty's fresh output
    both = SamplingConfig(lz_penalty=1.0, presence_penalty=0.5)
    procs = build_logits_processors(both, prompt_length=1, inplace=False)
    assert procs[-1].inplace
    assert torch.equal(procs(ids, scores), out - 0.5 * (out != keep))
    assert torch.equal(scores, keep)
