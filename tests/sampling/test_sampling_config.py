"""SamplingConfig: defaults, helpers, and one clear error per bad value."""

import dataclasses

import pytest

from rpt.sampling import SamplingConfig

KNOBS = {
    "max_new_tokens", "temperature", "top_k", "top_p", "min_p", "rpt_iters", "rpt_window", "ptp_greedy",
    "confidence", "repetition_penalty", "frequency_penalty", "presence_penalty", "lz_penalty", "lz_window",
    "lz_buffer", "lz_include_prompt", "lz_variant", "penalize_ptp", "token_healing", "stop", "eos_token_id", "seed",
}


def test_every_knob_and_defaults():
    cfg = SamplingConfig()
    assert {f.name for f in dataclasses.fields(cfg)} == KNOBS
    assert cfg.temperature == 0 and cfg.greedy and cfg.deterministic
    assert (cfg.confidence, cfg.lz_window, cfg.lz_buffer) == (0.9, 512, 32)
    assert cfg.lz_penalty == 0 and not cfg.lz_include_prompt and cfg.penalize_ptp and cfg.lz_variant == "codelength"
    assert cfg.rpt_iters == 0 and cfg.stop == [] and cfg.eos_token_ids == []


def test_helpers():
    assert not SamplingConfig(temperature=0.7).greedy
    assert SamplingConfig(rpt_iters=2, ptp_greedy=True).deterministic
    assert SamplingConfig(rpt_iters=2, ptp_greedy=False).deterministic  # greedy NTP makes PTP greedy too
    assert not SamplingConfig(rpt_iters=2, temperature=0.5).deterministic
    assert SamplingConfig(rpt_iters=0, ptp_greedy=False).deterministic
    assert not SamplingConfig(temperature=1.0).deterministic
    assert SamplingConfig(eos_token_id=3).eos_token_ids == [3]
    assert SamplingConfig(eos_token_id=(3, 4)).eos_token_ids == [3, 4]
    assert SamplingConfig(stop=("\n\n",)).stop == ["\n\n"]
    assert dataclasses.replace(SamplingConfig(), lz_penalty=0.15).lz_penalty == 0.15


@pytest.mark.parametrize(
    "field,value,hint",
    [
        ("max_new_tokens", 0, ">= 1"),
        ("max_new_tokens", 2.5, "integer"),
        ("temperature", -0.1, "greedy"),
        ("temperature", float("nan"), "finite"),
        ("top_k", -1, ">= 0"),
        ("top_p", 0.0, "(0, 1]"),
        ("top_p", 1.5, "(0, 1]"),
        ("min_p", 1.2, "[0, 1]"),
        ("rpt_iters", -1, ">= 0"),
        ("rpt_window", 1, "2 or 3"),
        ("confidence", 1.1, "[0, 1]"),
        ("repetition_penalty", 0.0, "> 0"),
        ("frequency_penalty", 2.5, "[-2, 2]"),
        ("presence_penalty", -3.0, "[-2, 2]"),
        ("lz_penalty", -0.15, "alpha >= 0"),
        ("lz_window", 0, ">= 1"),
        ("lz_buffer", 0, ">= 1"),
        ("lz_include_prompt", 1, "True or False"),
        ("ptp_greedy", "yes", "True or False"),
        ("stop", "\n", "list of non-empty strings"),
        ("stop", [""], "list of non-empty strings"),
        ("eos_token_id", -1, "token id"),
        ("eos_token_id", [1, "x"], "token id"),
        ("seed", 1.5, "integer"),
        ("top_k", True, "integer"),
    ],
)
def test_bad_values_name_the_field_and_the_fix(field, value, hint):
    with pytest.raises(ValueError) as err:
        SamplingConfig(**{field: value})
    assert f"SamplingConfig.{field}=" in str(err.value)
    assert hint in str(err.value)


def test_validate_after_mutation():
    cfg = SamplingConfig()
    cfg.lz_buffer = -3
    with pytest.raises(ValueError, match="lz_buffer"):
        cfg.validate()


def test_int_knobs_become_floats():
    """``repetition_penalty=2`` becomes 2.0, which Hugging Face's processor accepts (it refuses an int)."""
    cfg = SamplingConfig(repetition_penalty=2, temperature=1, top_p=1, frequency_penalty=1, lz_penalty=0)
    assert isinstance(cfg.repetition_penalty, float) and cfg.repetition_penalty == 2.0
    assert all(isinstance(getattr(cfg, f), float) for f in ("temperature", "top_p", "frequency_penalty", "lz_penalty"))
    import torch

    from rpt.sampling.processors import build_logits_processors

    procs = build_logits_processors(cfg, prompt_length=0)
    scores = procs(torch.tensor([[0, 1]]), torch.zeros(1, 4))
    assert scores.shape == (1, 4)
