"""The engine driver of RPT (rpt.integrations.vllm_rpt.driver) against the uncached oracle, with no
engine: a fake step answers each planned block with one model call on the block's own row layout
(the re-fed token, the tail, the PTP chains in the slots after the newest token, offset rows and true
positions from the id codes, each chain seeing the columns before the token it may replace and its
own earlier tokens). Tokens, corrections and finish equal generate_reference's, greedy and seeded."""

from types import SimpleNamespace

import pytest
import torch

from rpt.integrations.vllm_rpt.codes import chain_ids, code_tables
from rpt.integrations.vllm_rpt.driver import RequestDriver
from rpt.integrations.vllm_rpt.settings import RPTSettingError, parse_settings, rpt_budget
from rpt.model import RPTForCausalLM
from rpt.sampling import SamplingConfig
from rpt.sampling.reference import generate_reference
from tests.helpers.tiny_models import tiny_llama

V = 97


@pytest.fixture(scope="module")
def model():
    model = RPTForCausalLM.from_base(tiny_llama(seed=1, initializer_range=0.4), window=3).eval()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        model.offset_embedding.weight.copy_(0.5 * torch.randn(model.offset_embedding.weight.shape, generator=g))
        model.offset_embedding.weight[0].zero_()  # a saved checkpoint folds row 0 into the embedding
    model.lm.generation_config.eos_token_id = None
    return model


@torch.no_grad()
def fake_step(model, driver: RequestDriver) -> torch.Tensor:
    """The logits of the planned block's rows, from one call over the whole layout (no cache): ids
    decoded from their codes, true positions, and the chains' visibility."""
    b = driver.block
    ids = list(b.tokens[: b.n + 1])
    ids += chain_ids(list(b.tokens), b.n, b.lags, V)
    slots = torch.arange(len(ids))
    codes, tokens = torch.tensor(ids) // V, torch.tensor(ids) % V
    offset, shift, lag = code_tables(3)
    positions = slots - shift[codes]
    # chain rows see the columns before x_{n-l} and the chain's own slots so far
    chain_start = slots - (positions - (b.n - lag[codes] + 1))
    key = slots[None, :]
    limit = torch.where(codes > 0, b.n - lag[codes] - 1, slots)[:, None]
    allowed = (key <= limit) | ((codes > 0)[:, None] & (key >= chain_start[:, None]) & (key <= slots[:, None]))
    out = model(tokens[None], position_ids=positions[None], offset_ids=offset[codes][None],
                attention_mask=allowed[None, None]).logits[0]
    return out[b.first:]


def drive(model, prompt, extra, max_new, stop_ids=(), temperature=0.0, seed=None):
    params = SimpleNamespace(extra_args=extra, temperature=temperature, seed=seed, top_k=0, top_p=1.0, min_p=0.0)
    settings = parse_settings(params, trained_window=3, source="the test model", max_new_tokens=max_new)
    driver = RequestDriver(prompt, settings, max_new, stop_ids)
    emitted = []
    while True:
        emitted += driver.step(fake_step(model, driver))
        if driver.finished:
            return emitted, driver
        driver.drafts(V)


def reference(model, prompt, extra, max_new, stop_ids=(), temperature=0.0, seed=None):
    config = SamplingConfig(max_new_tokens=max_new, eos_token_id=list(stop_ids), temperature=temperature, seed=seed,
                            **extra)
    out = generate_reference(model, torch.tensor([prompt]), config)
    return out.generated(0), out


SETTINGS = [(1, 2, 0.3), (1, 3, 0.3), (2, 3, 0.5), (1, 3, 0.0)]


@pytest.mark.parametrize("k,w,eta", SETTINGS)
def test_greedy_driver_equals_the_reference(model, k, w, eta):
    corrections = 0
    for length in (1, 6):
        prompt = torch.randint(0, V, (length,), generator=torch.Generator().manual_seed(length)).tolist()
        extra = {"rpt_iters": k, "rpt_window": w, "confidence": eta}
        got, driver = drive(model, prompt, extra, 10)
        want, ref = reference(model, prompt, extra, 10)
        assert got == want, (length, k, w, eta)
        assert driver.corrections == ref.stats["corrections"]
        corrections += driver.corrections
        # one step per token, plus one per position that corrected something, plus the window fill
        assert driver.steps <= 1 + 10 + w + 2 * driver.corrections
    if eta < 0.5:
        assert corrections >= 2  # replacement was exercised


def test_seeded_sampling_equals_the_reference_and_seeds_differ(model):
    prompt = [5, 17, 33, 2]
    extra = {"rpt_iters": 2, "rpt_window": 3, "confidence": 0.2}
    runs = []
    for seed in (3, 4):
        got, driver = drive(model, prompt, extra, 8, temperature=0.8, seed=seed)
        want, ref = reference(model, prompt, extra, 8, temperature=0.8, seed=seed)
        assert got == want and driver.corrections == ref.stats["corrections"]
        runs.append(got)
    assert runs[0] != runs[1]


def test_eos_inside_the_window_flushes_what_the_reference_keeps(model):
    prompt = [7, 7, 8]
    extra = {"rpt_iters": 1, "rpt_window": 3, "confidence": 0.3}
    plain, _ = reference(model, prompt, extra, 16)
    stop = plain[5]  # a token the decode reaches: the row stops there, inside the window
    got, driver = drive(model, prompt, extra, 16, stop_ids=[stop])
    want, ref = reference(model, prompt, extra, 16, stop_ids=[stop])
    assert got == want and got[-1] == stop and len(got) < 16 and driver.finished


@pytest.mark.parametrize("extra,match", [
    ({"rpt_iters": 1, "rpt_window": 4}, r"rpt_window=4 is larger than the window 3"),
    ({"rpt_iters": 1, "confidence": 1.5}, r"confidence=1.5 is invalid: use a probability in \[0, 1\]"),
    ({"rpt_iters": 1, "confidence": float("nan")}, r"confidence=nan is invalid: use a finite number"),
    ({"rpt_iters": 10**9}, r"rpt_iters=1000000000 is above the engine's bound 16"),
    ({"rpt_window": 2}, r"without 'rpt_iters'"),
    ({"rpt_iters": 1, "lz_penalty": 0.1}, r"lz_penalty together with rpt_iters"),
])
def test_bad_settings_are_one_line_errors(extra, match):
    params = SimpleNamespace(extra_args=extra, temperature=0.0, seed=None)
    with pytest.raises(RPTSettingError, match=match) as info:
        parse_settings(params, trained_window=3, source="CKPT")
    assert "\n" not in str(info.value)


def test_refusals_and_plain_requests():
    ok = {"rpt_iters": 1}
    with pytest.raises(RPTSettingError, match="has no rpt_config.json"):
        parse_settings(SimpleNamespace(extra_args=ok), trained_window=None, source="CKPT")
    with pytest.raises(RPTSettingError, match="logprobs"):
        parse_settings(SimpleNamespace(extra_args=ok, logprobs=2), trained_window=3, source="CKPT")
    with pytest.raises(RPTSettingError, match="stop strings"):
        parse_settings(SimpleNamespace(extra_args=ok, stop=["\n"]), trained_window=3, source="CKPT")
    assert parse_settings(SimpleNamespace(extra_args={"rpt_iters": 0}), trained_window=None, source="C") is None
    assert parse_settings(SimpleNamespace(extra_args={"lz_penalty": 0.1}), trained_window=None, source="C") is None
    assert rpt_budget(10, 100, 64, 3) == 50 and rpt_budget(10, 5, 64, 3) == 5


def test_find_chains_reads_requests_lags_and_newest_positions_from_the_codes():
    """The model's view of a step: request 0 plain (3 rows), request 1 with tail rows up to n = 9 and the
    chains of lags 1 and 2 (codes 1; 2, 3), positions true after the shift."""
    from rpt.integrations.vllm_rpt.side_attention import find_chains

    _, shift, _ = code_tables(3)
    codes = torch.tensor([0, 0, 0, 0, 0, 0, 1, 2, 3])
    slots = torch.tensor([4, 5, 6, 7, 8, 9, 10, 11, 12])
    positions = slots - shift[codes]
    assert positions[6:].tolist() == [9, 8, 9]  # x_9 (lag 1), then x_8, x_9 (lag 2)
    chains = find_chains(codes, positions, torch.tensor([0, 3, 9]))
    assert [(c.lag, c.rows.tolist(), c.requests, c.newest) for c in chains] == [(1, [6], [1], [9]), (2, [7, 8], [1], [9])]
