"""The batch-flat NTP path (``rpt/sampling/decode/ntp_path.py``) against the uncached reference and against
the per-row driver it replaces for ``rpt_iters == 0``: the same tokens, finish reasons and calls
over random configurations (sampling, truncation, every penalty, EOS, ragged rows, budgets)."""

import random

import pytest
import torch

from rpt.sampling import SamplingConfig, generate, generate_reference
from rpt.sampling.decode import ntp_path
from tests.sampling.decode.test_decoder import V, prompts, rpt_model


@pytest.fixture(scope="module")
def model():
    return rpt_model(2)


def per_row_driver(monkeypatch, model, ids, cfg, mask):
    """``generate`` with the batch-flat path switched off: the per-row driver of every config."""
    with monkeypatch.context() as m:
        m.setattr(ntp_path, "eligible", lambda inputs, streamer: False)
        return generate(model, ids, cfg, attention_mask=mask)


def random_ntp_config(rng: random.Random, eos: int) -> SamplingConfig:
    return SamplingConfig(
        max_new_tokens=rng.choice([1, 5, 12]), temperature=rng.choice([0.0, 0.7, 1.0, 1.5]),
        top_k=rng.choice([0, 8]), top_p=rng.choice([1.0, 0.9]), min_p=rng.choice([0.0, 0.05]),
        repetition_penalty=rng.choice([1.0, 1.3]), frequency_penalty=rng.choice([0.0, 0.5]),
        presence_penalty=rng.choice([0.0, -0.3]), lz_penalty=rng.choice([0.0, 0.5]), lz_window=16,
        lz_include_prompt=rng.random() < 0.3, eos_token_id=rng.choice([[], eos]), seed=rng.randrange(10**6))


@pytest.mark.parametrize("case", range(12))
def test_ntp_path_equals_reference_and_per_row_driver(model, monkeypatch, case):
    rng = random.Random(case)
    batch = rng.choice([1, 3])
    ids, mask = prompts(batch, lengths=rng.choice([(9, 5, 7), (4, 10, 7), (6, 6, 6)]), seed=case)
    if batch == 1 or rng.random() < 0.3:
        ids, mask = ids[:, -4:], None  # unpadded rows: the mask-free steps
    free = generate(model, ids, SamplingConfig(max_new_tokens=12, eos_token_id=[]), attention_mask=mask)
    cfg = random_ntp_config(rng, eos=free.generated(0)[rng.randrange(4)])
    fast = generate(model, ids, cfg, attention_mask=mask)
    ref = generate_reference(model, ids, cfg, attention_mask=mask)
    rows = per_row_driver(monkeypatch, model, ids, cfg, mask)
    assert torch.equal(fast.sequences, ref.sequences) and torch.equal(fast.sequences, rows.sequences)
    assert fast.finish_reasons == ref.finish_reasons == rows.finish_reasons
    assert fast.new_token_counts == rows.new_token_counts
    assert fast.stats["forward_passes"] == rows.stats["forward_passes"]


def test_ntp_path_runs_for_plain_ntp_only(model, monkeypatch):
    """Taken for plain NTP; stop strings, healing, a streamer or RPT go through the per-row driver."""
    taken = []
    real = ntp_path.NTPPath.run
    monkeypatch.setattr(ntp_path.NTPPath, "run", lambda path: taken.append(1) or real(path))
    ids, mask = prompts(3)
    generate(model, ids, SamplingConfig(max_new_tokens=4), attention_mask=mask)
    assert taken == [1]
    generate(model, ids, SamplingConfig(max_new_tokens=4, rpt_iters=1), attention_mask=mask)
    assert taken == [1]


def test_rows_finish_on_eos_or_budget_and_pad_after(model):
    """A row that stops on EOS is padded after it while the others go on; a row near the context
    limit stops at its own budget; the reference agrees."""
    short = torch.randint(0, V, (1, 250), generator=torch.Generator().manual_seed(5))
    ids = torch.cat([torch.zeros(1, 246, dtype=torch.long), short[:, :4]], 1)
    ids, mask = torch.cat([ids, short]), torch.cat([(ids != 0) | (torch.arange(250) >= 246), torch.ones(1, 250)]).long()
    free = generate(model, ids, SamplingConfig(max_new_tokens=12, eos_token_id=[]), attention_mask=mask)
    assert free.new_token_counts == [12, 6]  # context 256: the long row's own budget
    eos = free.generated(0)[3]
    cfg = SamplingConfig(max_new_tokens=12, eos_token_id=eos)
    with pytest.warns(UserWarning, match="past the model's context"):
        fast = generate(model, ids, cfg, attention_mask=mask)
        ref = generate_reference(model, ids, cfg, attention_mask=mask)
    assert torch.equal(fast.sequences, ref.sequences) and fast.finish_reasons == ref.finish_reasons
    cut = free.generated(0).index(eos) + 1
    assert fast.generated(0) == free.generated(0)[:cut] and fast.finish_reasons[0] == "eos"
    assert (fast.sequences[0, 250 + cut:] == fast.sequences[0, -1]).all()


@pytest.mark.parametrize("width", [4096, 1024 + 64, 97, 2000])
def test_first_argmax_is_argmax_ties_included(width):
    """The two-level CPU argmax against torch's on heavy ties (integer logits) and on a strided view."""
    from rpt.sampling.proposals import first_argmax

    g = torch.Generator().manual_seed(width)
    ties = torch.randint(0, 3, (64, width), generator=g).float()
    assert torch.equal(first_argmax(ties), ties.argmax(-1))
    wide = torch.randn(8, 2, width, generator=g)[:, 1]  # a non-contiguous [8, width] view
    assert torch.equal(first_argmax(wide), wide.argmax(-1))
