"""One reader of an RPT checkpoint's rpt_config.json and offset table: every bad file is one error
naming the file and the key, raised before anything is allocated, the same at every entry point
(RPTForCausalLM.from_pretrained, sample.py, custom_generate); and RPT decoding of a checkpoint
trained without the RPT objective is refused."""

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

import sample
from rpt.checkpoint.directories import CheckpointError
from rpt.checkpoint.rpt_config import MAX_WINDOW, read_rpt_config
from rpt.model import RPTForCausalLM
from rpt.model.wrapper import RPT_CONFIG_NAME, RPT_TABLE_NAME
from tests.helpers.inprocess_train import one_error_line
from tests.helpers.tiny_models import save_tiny_checkpoint


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    path = tmp_path_factory.mktemp("good") / "ckpt"
    save_tiny_checkpoint(path, window=3)
    return path


def copy_of(good, tmp_path):
    target = tmp_path / "ckpt"
    shutil.copytree(good, target)
    return target


def edit_config(ckpt, **changes):
    config = json.loads((ckpt / RPT_CONFIG_NAME).read_text())
    for key, value in changes.items():
        if value is KeyError:
            config.pop(key, None)
        else:
            config[key] = value
    (ckpt / RPT_CONFIG_NAME).write_text(json.dumps(config))


def sample_error(capsys, ckpt, *extra) -> str:
    capsys.readouterr()
    assert sample.main(["--checkpoint", str(ckpt), "--prompt", "def f", "--max-new-tokens", "2", "--device", "cpu",
                        "--rpt-iters", "1", *extra]) == 2
    return one_error_line(capsys.readouterr().err)


BAD_CONFIGS = [
    ({"window": KeyError}, "no 'window' key"), ({"window": None}, "'window' = None"), ({"window": [3]}, "'window' = [3]"),
    ({"window": "two"}, "'window' = 'two'"), ({"window": 10**12}, f"integer in [2, {MAX_WINDOW}]"),
    ({"window": 1}, "'window' = 1"), ({"window": True}, "'window' = True"), ({"window": 3.0}, "'window' = 3.0"),
    ({"format_version": "2"}, "'format_version'"), ({"format_version": 9}, "upgrade rpt"),
    ({"objective": "rtp"}, "'objective' = 'rtp'"), ({"offset_rows": ["+1"]}, "'offset_rows'"),
    ({"untied_embeddings": "no"}, "'untied_embeddings'"), ({"lora": {"r": 4}}, "'lora'"),
]


@pytest.mark.parametrize("changes, message", BAD_CONFIGS)
def test_a_bad_rpt_config_is_one_error_naming_file_and_key_everywhere(good, tmp_path, capsys, changes, message):
    ckpt = copy_of(good, tmp_path)
    edit_config(ckpt, **changes)
    with pytest.raises(CheckpointError) as e:
        RPTForCausalLM.from_pretrained(ckpt)
    assert message in str(e.value) and RPT_CONFIG_NAME in str(e.value)
    line = sample_error(capsys, ckpt)
    assert message in line and str(ckpt / RPT_CONFIG_NAME) in line
    from rpt.hf_generate import rpt_model_for

    with pytest.raises(CheckpointError, match="rpt_config.json"):
        rpt_model_for(torch.nn.Module(), str(ckpt), 1)


@pytest.mark.parametrize("content, message", [("{", "not valid JSON"), ("[3]", "JSON object"), ('"3"', "JSON object")])
def test_rpt_config_that_is_not_a_json_object_is_named(good, tmp_path, content, message):
    ckpt = copy_of(good, tmp_path)
    (ckpt / RPT_CONFIG_NAME).write_text(content)
    with pytest.raises(CheckpointError, match=message) as e:
        read_rpt_config(ckpt)
    assert str(ckpt / RPT_CONFIG_NAME) in str(e.value)


def table_case(ckpt, case: str) -> None:
    file = ckpt / RPT_TABLE_NAME
    table = torch.randn(4, 32)
    if case == "one row":  # would broadcast into every row under copy_
        save_file({"offset_embedding.weight": table[:1].contiguous()}, file)
    elif case == "too few rows":
        save_file({"offset_embedding.weight": table[:3].contiguous()}, file)
    elif case == "another hidden size":
        save_file({"offset_embedding.weight": torch.randn(4, 16)}, file)
    elif case == "another key":
        save_file({"table": table}, file)
    elif case == "integer table":
        save_file({"offset_embedding.weight": torch.ones(4, 32, dtype=torch.long)}, file)
    elif case == "truncated":
        file.write_bytes(file.read_bytes()[:40])


@pytest.mark.parametrize("case, message", [
    ("one row", "shape [1, 32]"), ("too few rows", "shape [3, 32]"), ("another hidden size", "shape [4, 16]"),
    ("another key", "no tensor 'offset_embedding.weight'"), ("integer table", "not a floating table"),
    ("truncated", "cannot be read as safetensors"),
])
def test_a_bad_offset_table_is_one_error_never_broadcast(good, tmp_path, capsys, case, message):
    ckpt = copy_of(good, tmp_path)
    table_case(ckpt, case)
    with pytest.raises(CheckpointError) as e:
        RPTForCausalLM.from_pretrained(ckpt)
    assert message in str(e.value) and str(ckpt / RPT_TABLE_NAME) in str(e.value)
    assert message in sample_error(capsys, ckpt)


def test_the_table_loads_exactly_and_a_smaller_window_is_fine(good):
    model = RPTForCausalLM.from_pretrained(good)
    from safetensors.torch import load_file

    assert torch.equal(model.offset_embedding.weight, load_file(good / RPT_TABLE_NAME)["offset_embedding.weight"])
    assert RPTForCausalLM.from_pretrained(good, window=2).window == 3


def test_rpt_decoding_of_an_ntp_trained_checkpoint_is_refused(good, tmp_path, capsys):
    ckpt = copy_of(good, tmp_path)
    edit_config(ckpt, objective="ntp")
    line = sample_error(capsys, ckpt)
    assert "trained with objective ntp" in line and "--rpt-iters 0" in line
    capsys.readouterr()
    assert sample.main(["--checkpoint", str(ckpt), "--prompt", "def f", "--max-new-tokens", "2", "--device", "cpu"]) == 0
    # the model loaded from it keeps the record: generate() refuses too
    from rpt.sampling import SamplingConfig, generate

    model = RPTForCausalLM.from_pretrained(ckpt).eval()
    assert model.objective == "ntp"
    with pytest.raises(ValueError, match="objective ntp"):
        generate(model, torch.tensor([[1, 2, 3]]), SamplingConfig(max_new_tokens=2, rpt_iters=1))
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(ckpt)
    with pytest.raises(ValueError, match="objective ntp"):
        plain.generate(torch.tensor([[1, 2, 3]]), custom_generate=str(ckpt), trust_remote_code=True, rpt_iters=1,
                       max_new_tokens=2)


def test_a_checkpoint_without_the_record_decodes_with_one_printed_line(good, tmp_path, capsys):
    ckpt = copy_of(good, tmp_path)
    edit_config(ckpt, objective=KeyError)
    capsys.readouterr()
    argv = ["--checkpoint", str(ckpt), "--prompt", "def f", "--max-new-tokens", "2", "--device", "cpu", "--rpt-iters", "1"]
    assert sample.main(argv) == 0
    err = capsys.readouterr().err
    assert len([line for line in err.splitlines() if "does not record its training objective" in line]) == 1


def test_training_records_the_objective_through_lora_and_merge(tmp_path):
    pytest.importorskip("peft")
    from tests.helpers.inprocess_train import train_main
    from tests.helpers.scripts import load_script
    from tests.helpers.train_helpers import write_config

    cfg = write_config(tmp_path, max_steps=1, save_every=1, eval_batches=0, warmup_steps=0)
    assert train_main(cfg, "objective=ntp", f"output_dir={tmp_path / 'ntp'}") == 0
    assert read_rpt_config(tmp_path / "ntp" / "final").objective == "ntp"
    assert train_main(cfg, "lora={r: 2}", f"output_dir={tmp_path / 'lora'}") == 0
    assert read_rpt_config(tmp_path / "lora" / "final").objective == "rpt"
    assert load_script("merge_lora.py").main([str(tmp_path / "lora" / "final"), str(tmp_path / "merged")]) == 0
    merged = read_rpt_config(tmp_path / "merged")
    assert merged.objective == "rpt" and merged.lora is None
