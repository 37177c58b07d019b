"""prepare_data.py: parallel tokenisation into the store train.py reads, and its errors."""

import json
import os
import re
import subprocess
import sys

import pytest

from rpt.data import (
    DataError,
    TokenStore,
    build_packed,
    build_tokenizer,
    default_store_path,
    prepare_store,
    stdlib_texts,
)
from rpt.data.sources import is_validation_text
from rpt.training.config import load_config
from tests.helpers.inprocess_train import one_error_line
from tests.helpers.tiny_models import tiny_tokenizer
from tests.helpers.train_helpers import ROOT, env, run_train, write_config, write_jsonl


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


def test_out_dir_trains_as_a_token_source(tmp_path, capsys):
    # both scripts' main() in this process: the store and its use are under test, not the process boundary
    from tests.helpers.inprocess_train import train_main

    cfg = corpus_config(tmp_path)
    code, stdout, err = prepare_main(capsys, "--config", cfg, "--out", tmp_path / "store", "--num-proc", "1")
    assert code == 0, err[-2000:]
    assert f"data: {{tokens: {tmp_path / 'store'}}}" in stdout
    assert sorted(os.listdir(tmp_path / "store")) == ["train", "validation"]
    tokens_cfg = write_config(tmp_path, data={"tokens": str(tmp_path / "store")}, tokenizer=None,
                              max_steps=2, save_every=100, eval_every=2, output_dir=str(tmp_path / "run2"))
    assert train_main(tokens_cfg) == 0, capsys.readouterr().err[-2000:]
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


def read_source(tmp_path, name: str, content: bytes, **source):
    from rpt.data.sources import source_documents

    (tmp_path / name).write_bytes(content)
    return [ex["text"] for ex in source_documents({"path": str(tmp_path / name), **source}, None, 0.0)]


@pytest.mark.parametrize("line, message", [
    (b'{"text": {"body": "x"}}', "the text field 'text' is an object"), (b'{"text": ["a"]}', "is a list"),
    (b'{"text": 5}', "is a number"), (b'{"text": true}', "is a boolean"), (b'{"text": "\\ud800"}', "unpaired surrogate"),
    (b'{"text": "caf\xe9"}', "is not UTF-8 text"), (b'{"text": "x"', "is not valid JSON"), (b"[1, 2]", "no text field"),
    (b"\x00\x01\x02\xff" * 50, "is not UTF-8 text"),
])
def test_a_jsonl_line_that_is_not_a_text_document_is_named_with_file_and_line(tmp_path, line, message):
    content = b'{"text": "first"}\n\n' + line + b'\n{"text": "last"}\n'
    with pytest.raises(DataError, match=re.escape(message)) as e:
        read_source(tmp_path, "c.jsonl", content)
    assert f"{tmp_path / 'c.jsonl'} line 3" in str(e.value)


def test_text_and_parquet_sources_refuse_what_is_not_text(tmp_path):
    assert read_source(tmp_path, "ok.txt", "café\n".encode()) == ["café\n"]
    with pytest.raises(DataError, match=r"latin.txt line 2 is not UTF-8 text \(byte 0xe9\)"):
        read_source(tmp_path, "latin.txt", "one\ncafé\n".encode("latin-1"))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [{"body": "x"}]}), tmp_path / "t.parquet")
    with pytest.raises(DataError, match="t.parquet: the text field 'text' is a column of struct"):
        read_source(tmp_path, "t.parquet", (tmp_path / "t.parquet").read_bytes())


def prepare_main(capsys, *argv) -> tuple[int, str, str]:
    import prepare_data

    try:
        code = prepare_data.main([str(a) for a in argv])
    except SystemExit as e:  # argparse's errors (one line: OneLineArgumentParser)
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_flags_out_of_range_and_unusable_outputs_are_one_line(tmp_path, capsys):
    cfg = corpus_config(tmp_path)
    (tmp_path / "a_file").write_text("x")
    cases = [
        (["--max-tokens", "-5"], "a negative number of tokens"), (["--max-tokens", "0"], "0 would write no tokens"),
        (["--max-tokens", "nan"], "not a whole number"), (["--max-tokens", "lots"], "not a number of tokens"),
        (["--num-proc", "0"], "--num-proc 0 must be between 1"), (["--num-proc", "100000"], "between 1 and 1024"),
        (["--out", tmp_path / "a_file"], "is a file"), (["--out", tmp_path / "a_file" / "sub"], "cannot be created"),
    ]
    for argv, message in cases:
        code, _, err = prepare_main(capsys, "--config", cfg, *argv)
        assert code == 2 and message in one_error_line(err), (argv, err)
    code, _, err = prepare_main(capsys)
    assert code == 2 and "--config is required" in one_error_line(err)
    assert sorted(os.listdir(tmp_path)) == ["a_file", "config.yaml", "corpus.jsonl"]  # nothing written


def test_a_rewritten_corpus_is_prepared_again_and_a_reused_out_dir_never_mixes_two(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    write_jsonl(corpus, [f"def f{i}(x):\n    return x * {i}\n" for i in range(40)])
    cfg = write_config(tmp_path, data={"path": str(corpus)}, tokenizer=os.path.join(tmp_path, "tok"), eval_batches=0)
    tiny_tokenizer().save_pretrained(tmp_path / "tok")
    config = load_config(cfg)
    tokenizer = build_tokenizer(config)
    cached = default_store_path(config, "train", tokenizer)
    out = tmp_path / "out"
    code, stdout, err = prepare_main(capsys, "--config", cfg, "--out", out, "--max-tokens", "3e2")
    assert code == 0, err
    assert TokenStore(str(out / "train")).num_tokens == 300 and TokenStore(str(out / "train")).verify()
    code, stdout, _ = prepare_main(capsys, "--config", cfg, "--out", out, "--max-tokens", "300")
    assert code == 0 and "already holds this data's token store; kept" in stdout
    before = (out / "train" / "index.json").read_bytes()
    code, _, err = prepare_main(capsys, "--config", cfg, "--out", out, "--max-tokens", "200")  # another cut
    assert code == 2 and "was built from other data or settings" in one_error_line(err)
    write_jsonl(corpus, [f"class C{i}:\n    pass\n" for i in range(40)])  # the corpus rewritten in place
    code, _, err = prepare_main(capsys, "--config", cfg, "--out", out, "--max-tokens", "300")
    line = one_error_line(err)
    assert code == 2 and "whose files have changed since" in line and "choose another --out" in line
    assert (out / "train" / "index.json").read_bytes() == before  # the old store kept whole, not mixed
    # the cache key follows the content: train.py's store of the rewritten corpus is prepared again, with a note
    assert default_store_path(config, "train", tokenizer) != cached
    lines = []
    prepare_store(config, "train", tokenizer, progress=False, log=lines.append)
    os.utime(corpus, ns=(0, 0))
    prepare_store(config, "train", tokenizer, progress=False, log=lines.append)
    assert any("data's files changed (size or modification time)" in line for line in lines), lines


def test_verify_flag_checks_a_store_in_full(tmp_path, capsys):
    from rpt.data import write_token_store

    write_token_store(str(tmp_path / "s" / "train"), ["a b c", "d e f"], tiny_tokenizer(), progress=False)
    code, stdout, _ = prepare_main(capsys, "--verify", tmp_path / "s")
    assert code == 0 and "1 shard(s)" in stdout and "verified (SHA-256 and token ids)" in stdout
    shard = tmp_path / "s" / "train" / "tokens-00000.bin"
    shard.write_bytes(shard.read_bytes()[::-1])
    code, _, err = prepare_main(capsys, "--verify", tmp_path / "s")
    assert code == 2 and "tokens-00000.bin changed after the store was written" in one_error_line(err)
    code, _, err = prepare_main(capsys, "--verify", tmp_path)
    assert code == 2 and "is not a token store" in one_error_line(err)


def test_a_token_store_naming_a_file_outside_it_is_one_line_from_train_py(tmp_path, capsys):
    """The security case end to end: a store whose index.json names another file of this machine."""
    from rpt.data import write_token_store
    from tests.helpers.inprocess_train import train_main

    write_token_store(str(tmp_path / "s" / "train"), ["a b c " * 200], tiny_tokenizer(), progress=False)
    index = json.loads((tmp_path / "s" / "train" / "index.json").read_text())
    secret = tmp_path / "secret"
    secret.write_bytes(b"\x07\x00" * index["shards"][0]["tokens"])
    index["shards"][0]["file"] = str(secret)
    (tmp_path / "s" / "train" / "index.json").write_text(json.dumps(index))
    cfg = write_config(tmp_path, data={"tokens": str(tmp_path / "s")}, tokenizer=None, eval_batches=0)
    assert train_main(cfg) == 2
    assert "is not a file inside the store" in one_error_line(capsys.readouterr().err)


def test_a_hub_sources_key_follows_the_commit_its_cache_holds(tmp_path, monkeypatch):
    """Offline, a hub dataset's content is the commit the local hub cache holds: a newer download
    (another refs/main) keys another store; a pinned commit is its own key."""
    from huggingface_hub import constants

    from rpt.data.sources import content_fingerprint, hub_dataset_commit

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    refs = tmp_path / "datasets--org--corpus" / "refs"
    refs.mkdir(parents=True)
    source = {"hub": "org/corpus", "split": "train"}
    keys = []
    for commit in ("a" * 40, "b" * 40):
        (refs / "main").write_text(commit)
        hub_dataset_commit.cache_clear()
        keys.append(content_fingerprint(source))
    assert keys[0] != keys[1] and hub_dataset_commit("org/corpus", "c" * 40) == "c" * 40
    hub_dataset_commit.cache_clear()


@pytest.mark.parametrize("damage, message", [(b"\xff\xfe{}", "tokenizer.json is not UTF-8 text (byte 0xff"),
                                             (b'{"model": ', "tokenizer.json is not valid JSON")])
def test_a_damaged_tokenizer_file_is_named(tmp_path, damage, message):
    from rpt.data.tokenizer import load_tokenizer

    tiny_tokenizer().save_pretrained(tmp_path / "tok")
    (tmp_path / "tok" / "tokenizer.json").write_bytes(damage)
    with pytest.raises(DataError, match=re.escape(message)) as e:
        load_tokenizer(str(tmp_path / "tok"))
    assert str(tmp_path / "tok" / "tokenizer.json") in str(e.value)
