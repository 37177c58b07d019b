"""A checkpoint saved by the code of d971d82 (before rpt/ was cut into packages by job) still loads
and decodes the tokens it decoded then: ``tests/fixtures/checkpoint_d971d82/`` holds a full RPT
checkpoint, a LoRA adapter and the tokens of fixed greedy and seeded decodes, written once by its
``make_fixture.py`` against that commit and never regenerated."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rpt.model import RPTForCausalLM
from rpt.sampling import SamplingConfig, generate

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoint_d971d82"
RECORD = json.loads((FIXTURE / "decodes.json").read_text())


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A copy of the fixture (loading must not be able to touch the committed files)."""
    out = tmp_path_factory.mktemp("old") / "checkpoint_d971d82"
    shutil.copytree(FIXTURE, out)
    return out


def decode(model, name: str):
    fields = RECORD["decodes"][name]
    out = generate(model, torch.tensor(RECORD["prompts"]), SamplingConfig(eos_token_id=None, **fields),
                   torch.tensor(RECORD["attention_mask"]))
    return out.sequences.tolist(), int(out.stats["corrections"])


@pytest.mark.parametrize("kind", ["full", "lora"])  # lora: the loader rpt_config.json's "lora" key registers
def test_old_checkpoint_loads_and_decodes_the_same_tokens(saved, kind):
    model = RPTForCausalLM.from_pretrained(saved / kind).eval()
    assert getattr(model, "merged_from_lora", False) == (kind == "lora")
    for name, want in RECORD["tokens"][kind].items():
        sequences, corrections = decode(model, name)
        assert sequences == want["sequences"], name
        assert corrections == want["corrections"] > 0, name  # the comparison covers real corrections


def test_old_checkpoints_custom_generate_still_runs(saved):
    """transformers runs the checkpoint's own custom_generate/generate.py, which imports rpt.hf_generate."""
    path = saved / "full"
    plain = AutoModelForCausalLM.from_pretrained(path).eval()
    fields = RECORD["decodes"]["greedy_rpt"]
    out = plain.generate(torch.tensor(RECORD["prompts"]), attention_mask=torch.tensor(RECORD["attention_mask"]),
                         custom_generate=str(path), trust_remote_code=True, do_sample=False, **fields)
    assert out.tolist() == RECORD["tokens"]["full"]["greedy_rpt"]["sequences"]


def test_new_checkpoints_carry_the_same_custom_generate_files(saved, tmp_path):
    """What a checkpoint saved today carries is byte for byte what the old one carries (its door,
    rpt.hf_generate, is a frozen path)."""
    RPTForCausalLM.from_pretrained(saved / "full").save_pretrained(tmp_path / "new")
    old, new = saved / "full" / "custom_generate", tmp_path / "new" / "custom_generate"
    assert sorted(p.name for p in new.iterdir()) == sorted(p.name for p in old.iterdir())
    for name in ("generate.py", "requirements.txt"):
        assert (new / name).read_bytes() == (old / name).read_bytes(), name
