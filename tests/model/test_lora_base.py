"""A LoRA adapter records a fingerprint of its base: loading or merging it onto another base (same
shape, other weights) or another base shape is one error; the same base in bfloat16 still loads."""

import json

import pytest
import torch

from rpt.checkpoint.directories import CheckpointError
from rpt.model import RPTForCausalLM
from rpt.model.lora import save_lora_checkpoint
from rpt.model.wrapper import RPT_CONFIG_NAME
from tests.helpers.inprocess_train import one_error_line
from tests.helpers.scripts import load_script
from tests.helpers.tiny_models import tiny_llama
from tests.model.test_lora import SECTION, lora_model

pytest.importorskip("peft")


def adapter_on_saved_base(tmp_path):
    """An adapter whose base is a directory (its rpt_config.json names the path)."""
    base_dir = tmp_path / "base"
    tiny_llama(seed=0).save_pretrained(base_dir)
    from transformers import AutoModelForCausalLM

    model, _ = lora_model(AutoModelForCausalLM.from_pretrained(base_dir))
    save_lora_checkpoint(model, str(tmp_path / "lora"), SECTION, base=str(base_dir))
    return base_dir, tmp_path / "lora"


def test_adapter_loads_on_its_base_in_float32_and_bfloat16(tmp_path):
    _, lora = adapter_on_saved_base(tmp_path)
    record = json.loads((lora / RPT_CONFIG_NAME).read_text())["lora"]["base_fingerprint"]
    assert "model.embed_tokens.weight" in record and len(record) == 3
    RPTForCausalLM.from_pretrained(lora)
    RPTForCausalLM.from_pretrained(lora, dtype=torch.bfloat16)


def test_adapter_onto_another_base_of_the_same_shape_is_refused(tmp_path, capsys):
    base_dir, lora = adapter_on_saved_base(tmp_path)
    tiny_llama(seed=1).save_pretrained(base_dir)  # the base directory now holds another model
    with pytest.raises(CheckpointError, match="trained on another base"):
        RPTForCausalLM.from_pretrained(lora)
    assert load_script("merge_lora.py").main([str(lora), str(tmp_path / "merged")]) == 2
    assert "trained on another base" in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "merged").exists()


@pytest.mark.parametrize("fingerprint", [True, False])
def test_adapter_onto_another_base_shape_is_one_line(tmp_path, capsys, fingerprint):
    base_dir, lora = adapter_on_saved_base(tmp_path)
    if not fingerprint:  # an adapter written before fingerprints: PEFT's size mismatch, in one line
        config = json.loads((lora / RPT_CONFIG_NAME).read_text())
        del config["lora"]["base_fingerprint"]
        (lora / RPT_CONFIG_NAME).write_text(json.dumps(config))
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2)).save_pretrained(base_dir)
    assert load_script("merge_lora.py").main([str(lora), str(tmp_path / "merged")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(lora) in line and ("another model shape" in line or "does not fit the base" in line)


def test_a_damaged_fingerprint_record_is_named(tmp_path):
    _, lora = adapter_on_saved_base(tmp_path)
    config = json.loads((lora / RPT_CONFIG_NAME).read_text())
    config["lora"]["base_fingerprint"] = {"model.embed_tokens.weight": {"shape": "97x32"}}
    (lora / RPT_CONFIG_NAME).write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="'lora.base_fingerprint'"):
        RPTForCausalLM.from_pretrained(lora)


def test_a_missing_base_is_named_as_the_missing_directory(tmp_path, capsys):
    base_dir, lora = adapter_on_saved_base(tmp_path)
    base_dir.rename(tmp_path / "moved")
    with pytest.raises(CheckpointError, match=f"'lora.base'\\) '{base_dir}' does not exist"):
        RPTForCausalLM.from_pretrained(lora)
    assert load_script("merge_lora.py").main([str(lora), str(tmp_path / "merged")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(base_dir) in line and "does not exist" in line and "Repo id" not in line
