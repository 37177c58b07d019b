"""Typos in nested mappings and settings that cannot do what they say are one error naming the key."""

import pytest

from rpt.training.config import ConfigError, load_config
from rpt.training.measure.metrics import read_metrics
from tests.helpers.inprocess_train import train_main
from tests.helpers.train_helpers import write_config


@pytest.mark.parametrize("bad, match", [
    ({"val_data": {"hub": "ds", "spilt": "validation"}}, r"unknown key 'spilt' in val_data \(hub source\); did you mean 'split'"),
    ({"data": {"path": "c.jsonl", "streming": True}}, r"unknown key 'streming' in data \(path source\); did you mean 'streaming'"),
    ({"data": [{"path": "a.jsonl"}, {"path": "b.jsonl", "wieght": 9}]}, r"unknown key 'wieght' in data\[1\] \(path source\); did you mean 'weight'"),
    ({"data": {"stdlib": {"max_file": 3}}}, r"unknown key 'max_file' in data.stdlib; did you mean 'max_files'"),
    ({"tokenizer": {"train_bpe": {"vocab": 300}}}, r"unknown key 'vocab' in tokenizer.train_bpe"),
    ({"model": {"model_type": "llama", "hiden_size": 64}}, r"unknown key 'hiden_size' in model \(a llama config\); did you mean 'hidden_size'"),
    ({"model": {"model_type": "qwen3", "head_dimm": 64}}, r"unknown key 'head_dimm' in model \(a qwen3 config\); did you mean 'head_dim'"),
    ({"model": {"model_type": "lama"}}, r"unknown model.model_type 'lama'; did you mean 'llama'"),
    ({"attn_implementation": "flash_attention_2", "micro_batch_size": 1}, r"'attn_implementation' = 'flash_attention_2' is invalid: flash attention with micro_batch_size 1"),
    ({"attn_implementation": "flash_attention_3", "micro_batch_size": 1}, r"'attn_implementation'.*use attn_implementation: sdpa"),
])
def test_nested_typos_and_impossible_settings_name_the_key(tmp_path, bad, match):
    with pytest.raises(ConfigError, match=match):
        load_config(write_config(tmp_path, **bad))


def test_known_nested_keys_pass(tmp_path):
    cfg = load_config(write_config(
        tmp_path, warmup_steps=10, max_steps=10,
        data=[{"path": "a.jsonl", "text_field": "body", "streaming": True, "weight": 2},
              {"hub": "x/y", "config": "c", "split": "train", "revision": "main", "streaming": True}],
        model={"model_type": "qwen3", "hidden_size": 64, "head_dim": 16, "rope_theta": 1e6, "tie_word_embeddings": True,
               "num_key_value_heads": 2, "layer_types": None}))
    assert cfg.model["head_dim"] == 16 and cfg.warmup_steps == cfg.max_steps
    # a warmup longer than the run loads: the run shortens it to max_steps (tests/training/test_training.py)
    assert load_config(write_config(tmp_path, warmup_steps=11, max_steps=10)).warmup_steps == 11


@pytest.mark.parametrize("ok", [{"objective": "ntp", "micro_batch_size": 1}, {"micro_batch_size": 2}])
def test_flash_attention_where_it_reads_the_sequences_right(tmp_path, ok):
    # NTP positions are 0, 1, 2, ... (no packing to misread); two rows are never read as packed
    assert load_config(write_config(tmp_path, attn_implementation="flash_attention_2", **ok)).attn_implementation


def test_eval_every_fires_whatever_log_every(tmp_path):
    cfg = write_config(tmp_path, log_every=2, eval_every=3, max_steps=6, save_every=100)
    assert train_main(cfg) == 0  # in this process: the schedule, not the process boundary, is under test
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows if "eval_ntp_loss" in r] == [3, 6]
    assert [r["step"] for r in rows if "loss" in r] == [2, 4, 6]
