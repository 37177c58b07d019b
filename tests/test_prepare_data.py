"""prepare_data.py: parallel tokenisation into the store train.py reads, and its errors."""

import os
import subprocess
import sys

import pytest

from rpt.config import load_config
from rpt.data import DataError, TokenStore, build_packed, build_tokenizer, default_store_path, stdlib_texts
from rpt.data.sources import is_validation_text
from tests.tiny_models import tiny_tokenizer
from tests.train_helpers import ROOT, env, run_train, write_config, write_jsonl


def prepare(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(ROOT, "prepare_data.py"), *args], env=env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def corpus_config(tmp_path, **kw) -> str:
    path = write_jsonl(tmp_path / "corpus.jsonl", stdlib_texts(None, 0.0, max_files=30))
    return write_config(tmp_path, data={"path": path}, max_steps=2, save_every=100, eval_every=2, **kw)


@pytest.mark.slow  # 20+ s; test_out_dir_trains_as_a_token_source trains from a prepared store in the default suite
def test_prepare_then_train_reads_the_same_store(tmp_path):
    cfg = corpus_config(tmp_path)
    res = prepare("--config", cfg, "--num-proc", "2")
    assert res.returncode == 0, res.stderr[-2000:]
    lines = [line for line in res.stdout.splitlines() if line.startswith(("train:", "validation:"))]
    assert len(lines) == 2 and all("tokens/s with 2 process(es)" in line for line in lines), res.stdout
    config = load_config(cfg)
    tokenizer = build_tokenizer(config)
    train_store = TokenStore(default_store_path(config, "train", tokenizer))
    val_store = TokenStore(default_store_path(config, "validation", tokenizer))
    assert train_store.meta["num_proc"] == 2
    # The stores hold exactly the documents on each side of the held-out split, as the tokenizer
    # tokenises them (each followed by EOS), in file order.
    docs = stdlib_texts(None, 0.0, max_files=30)
    for store, validation in ((train_store, False), (val_store, True)):
        expected = []
        for doc in docs:
            if is_validation_text(doc, config.val_fraction) == validation:
                expected += tokenizer(doc, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        assert store.read(0, store.num_tokens).tolist() == expected
    trained = run_train(cfg)
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert "prepared" not in trained.stdout  # train.py found the stores, nothing tokenised again


def test_out_dir_trains_as_a_token_source(tmp_path):
    cfg = corpus_config(tmp_path)
    res = prepare("--config", cfg, "--out", str(tmp_path / "store"), "--num-proc", "1")
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"data: {{tokens: {tmp_path / 'store'}}}" in res.stdout
    assert sorted(os.listdir(tmp_path / "store")) == ["train", "validation"]
    tokens_cfg = write_config(tmp_path, data={"tokens": str(tmp_path / "store")}, tokenizer=None,
                              max_steps=2, save_every=100, eval_every=2, output_dir=str(tmp_path / "run2"))
    trained = run_train(tokens_cfg)
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert (tmp_path / "run2" / "final").is_dir()


def test_errors_are_one_line(tmp_path, capsys):
    import prepare_data

    cfg = corpus_config(tmp_path)
    assert prepare_data.main(["--config", cfg, "data.streaming=true"]) == 2
    assert "pass --out DIR" in capsys.readouterr().err
    assert prepare_data.main(["--config", cfg, "data.text_field=body"]) == 2
    err = capsys.readouterr().err
    assert "no text field 'body'" in err and len([line for line in err.splitlines() if line.startswith("error:")]) == 1
    # a cut store in cache_dir would never be read by train.py (which wants the whole corpus)
    assert prepare_data.main(["--config", cfg, "--max-tokens", "1000"]) == 2
    err = capsys.readouterr().err
    assert "--max-tokens needs --out DIR" in err
    cache = tmp_path / "cache"
    assert not (cache.is_dir() and [n for n in os.listdir(cache) if n.startswith("tokens-")])  # nothing written
    with pytest.raises(DataError, match="not a token store"):
        build_packed(load_config(write_config(tmp_path, data={"tokens": str(tmp_path)})), "train", tiny_tokenizer())
