"""What a run reads from a token store is checked: a shard rewritten in place (same size) since a
checkpoint stops the resume, and a token id outside the model's vocabulary is one line naming the
store, the id and the vocabulary, before the first step."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from rpt.data import DataError, PackedStore, TokenStore, write_token_store
from rpt.data import token_store as ts
from tests.helpers.inprocess_train import one_error_line, train_main
from tests.helpers.tiny_models import tiny_tokenizer
from tests.helpers.train_helpers import write_config

TEXTS = ["def f(x):\n    return x + 1\n" * 40, "class A:\n    pass\n" * 50, "import os\nprint(os.sep)\n" * 30]


def holed_tokenizer():
    """A word-level tokenizer that numbers a token past its length: 4 tokens, ids 0, 1, 2 and 500."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"a": 0, "b": 1, "<unk>": 2, "<eos>": 500}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<unk>", unk_token="<unk>")


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("stores") / "store")
    write_token_store(path, TEXTS, tiny_tokenizer(), shard_tokens=700, progress=False)
    return path


def copy_store(store_dir, tmp_path) -> str:
    out = str(tmp_path / "store")
    shutil.copytree(store_dir, out)
    return out


def edit_in_place(file: str, every: int = 7) -> None:
    """The seen case: the same bytes count, one token in ``every`` changed, written over the file."""
    data = np.fromfile(file, dtype=np.uint16)
    data[::every] = (data[::every] + 1) % 250
    with open(file, "r+b") as f:
        f.write(data.tobytes())


# ---- the largest id: recorded at writing, checked before the first step and in every row read ----------------------
def test_the_store_records_its_largest_id(store_dir):
    store = TokenStore(store_dir)
    everything = store.read(0, store.num_tokens)
    assert store.max_id() == int(everything.max()) and len(store.meta["shards"]) > 1
    for shard, file in zip(store.meta["shards"], store.files):
        assert shard["max_id"] == int(np.fromfile(file, dtype=np.uint16).max())
    top = store.max_id()
    store.check_vocabulary(top + 1)
    with pytest.raises(DataError, match=rf"token store {store_dir} holds token id {top}, outside the model's vocabulary of {top}"):
        store.check_vocabulary(top)


def test_rows_are_checked_where_the_store_records_no_largest_id(store_dir, tmp_path):
    path = copy_store(store_dir, tmp_path)
    index = json.loads(open(os.path.join(path, "index.json")).read())
    index.pop("max_id")
    for s in index["shards"]:
        s.pop("max_id")
    open(os.path.join(path, "index.json"), "w").write(json.dumps(index))
    packed = PackedStore(TokenStore(path), 33, seed=0)
    packed.limit_vocabulary(10)  # a store written before the id was recorded: nothing to refuse at once
    with pytest.raises(DataError, match=rf"token store {path} holds token id \d+ at token \d+, outside the model's vocabulary of 10"):
        packed.rows(range(4))
    packed.limit_vocabulary(300)
    assert packed.rows(range(4)).shape == (4, 33)


def test_train_refuses_a_store_with_ids_past_the_models_vocabulary_before_the_first_step(tmp_path, capsys):
    """A tokenizer numbering a token past its length (ids 0-2 and 500): a model of len(tokenizer) rows."""
    store = tmp_path / "s" / "train"
    write_token_store(str(store), ["a b a b a " * 300], holed_tokenizer(), progress=False)
    cfg = write_config(tmp_path, data={"tokens": str(tmp_path / "s")}, tokenizer=None, eval_batches=0, max_steps=2)
    assert train_main(cfg) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"token store {store} holds token id 500, outside the model's vocabulary of 4" in line
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # no step ran


# ---- the shards a resume reads hold the tokens its checkpoint was trained on -------------------------------------
def test_same_size_edit_after_the_stamps_is_refused_naming_the_shard(store_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(ts, "RACY_NS", 0)  # a store written long before its checkpoint: only changed stamps hash
    path = copy_store(store_dir, tmp_path)
    store = TokenStore(path)
    recorded = store.stamps()
    assert store.check_unchanged(recorded, "ckpt")["hashed"] == []  # unchanged: one stat per shard, nothing read
    os.utime(store.files[0])  # touched, same bytes: hashed and accepted
    assert store.check_unchanged(recorded, "ckpt")["hashed"] == [store.files[0]]
    size = os.path.getsize(store.files[1])
    edit_in_place(store.files[1])
    assert os.path.getsize(store.files[1]) == size
    with pytest.raises(DataError, match=rf"{store.files[1]} was rewritten since ckpt \(its SHA-256 differs"):
        TokenStore(path).check_unchanged(recorded, "ckpt")


def test_a_copied_store_is_hashed_and_accepted_and_a_racy_stamp_is_hashed(store_dir, tmp_path):
    store = TokenStore(store_dir)
    recorded = store.stamps()
    copied = TokenStore(copy_store(store_dir, tmp_path))  # other inodes and times, the same tokens
    assert len(copied.check_unchanged(recorded, "ckpt")["hashed"]) == len(copied.files)
    edit_in_place(copied.files[0])
    late = copied.stamps()  # taken after the edit, in the same tick as it: equal stamps prove nothing
    with pytest.raises(DataError, match="was rewritten since ckpt"):
        copied.check_unchanged(late, "ckpt")


def test_resume_after_a_shard_was_rewritten_in_place_is_refused(store_dir, tmp_path, capsys):
    os.makedirs(tmp_path / "s")
    path = copy_store(store_dir, tmp_path / "s")
    os.rename(path, tmp_path / "s" / "train")
    cfg = write_config(tmp_path, data={"tokens": str(tmp_path / "s")}, tokenizer=None, eval_batches=0, max_steps=2,
                       save_every=1, warmup_steps=1, seq_len=16)
    assert train_main(cfg) == 0
    assert train_main(cfg, "max_steps=3") == 0  # the shards as they were: the resume goes on
    shard = TokenStore(str(tmp_path / "s" / "train")).files[0]
    edit_in_place(shard)
    assert train_main(cfg, "max_steps=4") == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{shard} was rewritten since {tmp_path / 'run' / 'checkpoint-3'} was written" in line
    assert not (tmp_path / "run" / "checkpoint-4").exists()
