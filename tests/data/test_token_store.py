"""The token store, the chunk order and map-style reads, against independent truths: the HF
tokenizer's own output, exhaustive enumeration, a chi-square test."""

import json
import os
import re

import numpy as np
import pytest
import torch

from rpt.data import DataError, TokenStore, write_token_store
from rpt.data.order import ChunkOrder
from rpt.data.packed import PackedStore, StoreBatches
from rpt.data.sources import jsonl_shards, source_documents, stdlib_texts
from rpt.data.token_store import token_dtype
from tests.helpers.tiny_models import tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def docs():
    return stdlib_texts(None, 0.0, max_files=12)


def reference_tokens(tokenizer, texts) -> np.ndarray:
    """What the store must hold: each document's tokens (HF's public call) followed by EOS."""
    out = []
    for t in texts:
        out += tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return np.array(out)


@pytest.fixture(scope="module")
def written_by(tmp_path_factory, tokenizer, docs):
    """``{num_proc: (directory, index)}``: the same documents written by one process and by two
    (12 documents: 12 shards of the stream, more than the two workers' look-ahead of 4)."""
    out = {}
    for num_proc in (1, 2):
        where = tmp_path_factory.mktemp(f"proc{num_proc}")
        index = write_token_store(str(where / "s"), iter(docs), tokenizer, num_proc=num_proc, shard_tokens=5000,
                                  progress=False)
        out[num_proc] = where, index
    return out


@pytest.mark.parametrize("num_proc", [1, 2])
def test_store_holds_the_tokenizers_tokens_in_order(written_by, tokenizer, docs, num_proc):
    where, index = written_by[num_proc]
    store = TokenStore(str(where / "s"))
    ref = reference_tokens(tokenizer, docs)
    assert store.num_tokens == len(ref) == index["num_tokens"] and index["num_documents"] == len(docs)
    assert store.dtype == np.uint16 and len(store.files) == -(-len(ref) // 5000)  # several shard files
    assert np.array_equal(store.read(0, len(ref)), ref)
    assert np.array_equal(np.concatenate([store.memmap(i) for i in range(len(store.files))]), ref)
    # a read across a shard boundary
    assert np.array_equal(store.read(4990, 20), ref[4990:5010])
    assert index["tokens_per_s"] > 0 and index["num_proc"] == num_proc
    assert not [n for n in os.listdir(where) if ".tmp" in n]


def test_parallel_writer_writes_the_same_bytes(written_by):
    one, two = (written_by[n][0] / "s" for n in (1, 2))
    names = sorted(n for n in os.listdir(one) if n.startswith("tokens-"))
    assert len(names) > 1 and names == sorted(n for n in os.listdir(two) if n.startswith("tokens-"))
    for name in names:
        assert (one / name).read_bytes() == (two / name).read_bytes(), name


def test_uint32_when_the_vocabulary_does_not_fit_uint16(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32
    vocab = {f"w{i}": i for i in range(70_000)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="w69999")
    write_token_store(str(tmp_path / "s"), ["w1 w65535 w65536", "w69998"], tok, progress=False)
    store = TokenStore(str(tmp_path / "s"))
    assert store.dtype == np.uint32
    assert store.read(0, store.num_tokens).tolist() == [1, 65535, 65536, 69999, 69998, 69999]


def _dies_after_one(text):
    yield {"text": text}
    raise RuntimeError("source died")


def test_max_tokens_and_atomic_failure(tmp_path, tokenizer, docs):
    index = write_token_store(str(tmp_path / "cut"), iter(docs), tokenizer, max_tokens=1000, progress=False)
    assert index["num_tokens"] == 1000
    assert np.array_equal(TokenStore(str(tmp_path / "cut")).read(0, 1000), reference_tokens(tokenizer, docs)[:1000])

    import datasets

    broken = datasets.IterableDataset.from_generator(_dies_after_one, gen_kwargs={"text": docs[0]})
    with pytest.raises(RuntimeError, match="source died"):
        write_token_store(str(tmp_path / "broken"), broken, tokenizer, progress=False)
    assert sorted(os.listdir(tmp_path)) == ["cut"]  # nothing half-written left behind
    with pytest.raises(DataError, match="no tokens"):
        write_token_store(str(tmp_path / "empty"), iter([]), tokenizer, progress=False)
    with pytest.raises(DataError, match="not a token store"):
        TokenStore(str(tmp_path))


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 100, 1000, 4097])
def test_chunk_order_is_a_permutation_per_epoch(n):
    order = ChunkOrder(n, seed=5)
    for epoch in (0, 1):
        assert sorted(order(epoch, np.arange(n)).tolist()) == list(range(n))
    if n >= 64:
        assert not np.array_equal(order(0, np.arange(n)), order(1, np.arange(n)))
        assert not np.array_equal(order(0, np.arange(n)), ChunkOrder(n, seed=6)(0, np.arange(n)))


def test_chunk_order_first_place_is_uniform():
    # Over 3000 seeds, the chunk read first out of 10 is uniform: chi-square, 9 dof, p = 0.001 at 27.9.
    counts = np.bincount([int(ChunkOrder(10, seed)(0, 0)[0]) for seed in range(3000)], minlength=10)
    chi2 = float(((counts - 300.0) ** 2 / 300.0).sum())
    assert chi2 < 27.9, counts


def test_packed_store_reads_chunks_by_global_index(tmp_path, tokenizer, docs):
    write_token_store(str(tmp_path / "s"), iter(docs), tokenizer, progress=False)
    store = TokenStore(str(tmp_path / "s"))
    flat = store.read(0, store.num_tokens)
    packed = PackedStore(store, chunk_len=33, seed=1)
    n = len(packed)
    assert n == store.num_tokens // 33
    # each epoch reads every chunk exactly once, and a row is its chunk's tokens
    rows = packed.rows(range(2 * n))
    for epoch in (0, 1):
        ids = packed.chunk_ids(range(epoch * n, (epoch + 1) * n))
        assert sorted(ids.tolist()) == list(range(n))
        for r, c in zip(rows[epoch * n : (epoch + 1) * n], ids):
            assert torch.equal(r, torch.from_numpy(flat[c * 33 : (c + 1) * 33]))
    assert torch.equal(packed.sequential(3, start=2), torch.from_numpy(flat[66 : 5 * 33].reshape(3, 33)))
    # two ranks x one micro-batch read what one rank x two micro-batches reads
    one, two = StoreBatches(packed, 4, 8), StoreBatches(packed, 4, 8)
    for step in (1, 9):
        assert torch.equal(torch.cat([one.micro_batch(step, 0), one.micro_batch(step, 1)]),
                           packed.rows(range((step - 1) * 8, step * 8)))
        assert torch.equal(two.micro_batch(step, 1), one.micro_batch(step, 1))


def test_jsonl_shards_own_each_line_once(tmp_path):
    lines = [json.dumps({"text": f"doc {i} " + "x" * (i % 37)}) for i in range(500)]
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(lines) + "\n")
    for shard_bytes in (1, 50, 997, 10**6):
        shards = jsonl_shards([str(path)], shard_bytes)
        from rpt.data.sources import _gen_jsonl

        got = [ex["text"] for ex in _gen_jsonl(shards, "text")]
        assert got == [json.loads(line)["text"] for line in lines], shard_bytes


def test_held_out_split_is_disjoint_and_by_text(tmp_path):
    texts = [f"document number {i}" for i in range(400)] + ["document number 7"] * 3  # copies
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    src = {"path": str(tmp_path / "c.jsonl")}
    train = [ex["text"] for ex in source_documents(src, "train", 0.2)]
    val = [ex["text"] for ex in source_documents(src, "validation", 0.2)]
    assert sorted(train + val) == sorted(texts)
    assert not set(train) & set(val)  # exact copies land on the same side
    assert 40 <= len(val) <= 120


# ---- a store read back: every file checked before it is used ------------------------------------------
@pytest.fixture(scope="module")
def written(tmp_path_factory, tokenizer, docs):
    path = tmp_path_factory.mktemp("written") / "store"
    write_token_store(str(path), iter(docs), tokenizer, shard_tokens=5000, progress=False)
    return path


def tampered(written, tmp_path, edit) -> str:
    """A copy of the store with ``edit(index, store_dir)`` applied to its index.json (and files)."""
    import shutil

    store = tmp_path / "store"
    shutil.copytree(written, store)
    index = json.loads((store / "index.json").read_text())
    edit(index, store)
    (store / "index.json").write_text(json.dumps(index))
    return str(store)


def _outside(index, store):
    secret = store.parent / "secret.bin"
    secret.write_bytes(b"\x01\x00" * index["shards"][0]["tokens"])  # exactly the size the index promises
    index["shards"][0]["file"] = str(secret)


def _symlink_out(index, store):
    _outside(index, store)
    os.remove(store / "tokens-00000.bin")
    os.symlink(index["shards"][0]["file"], store / "tokens-00000.bin")
    index["shards"][0]["file"] = "tokens-00000.bin"


def _truncate(index, store):
    path = store / "tokens-00001.bin"
    path.write_bytes(path.read_bytes()[:-6])


HOSTILE_STORES = [
    ("an absolute path", _outside, "not a file inside the store"),
    ("a path up and out", lambda i, s: i["shards"][0].update(file="../written/store/tokens-00000.bin"), "not a file inside"),
    ("a link out of the store", _symlink_out, "not a file inside the store"),
    ("no shards key", lambda i, s: i.pop("shards"), "has no 'shards' list"),
    ("shards not a list", lambda i, s: i.update(shards="tokens-00000.bin"), "has no 'shards' list"),
    ("a negative count", lambda i, s: i["shards"][0].update(tokens=-5), "is not {\"file\""),
    ("a count that is a string", lambda i, s: i["shards"][0].update(tokens="5000"), "is not {\"file\""),
    ("another dtype", lambda i, s: i.update(dtype="float64"), "'dtype' = 'float64'"),
    ("a wrong total", lambda i, s: i.update(num_tokens=10**15), "'num_tokens'"),
    ("a shard cut short", _truncate, "holds 9994 bytes, but"),
    ("a shard that is a directory", lambda i, s: (os.remove(s / "tokens-00001.bin"), os.mkdir(s / "tokens-00001.bin")),
     "not a regular file"),
    ("a missing shard", lambda i, s: os.remove(s / "tokens-00001.bin"), "cannot be opened"),
]


@pytest.mark.parametrize("case, edit, message", HOSTILE_STORES, ids=[c[0] for c in HOSTILE_STORES])
def test_a_hostile_or_edited_store_is_refused_before_any_token_is_read(written, tmp_path, case, edit, message):
    store = tampered(written, tmp_path, edit)
    with pytest.raises(DataError, match=re.escape(message)) as e:
        TokenStore(store)
    assert store in str(e.value) and "prepare it again" in str(e.value)


@pytest.mark.parametrize("content, message", [(b"{", "is not valid JSON"), (b"\xff\xfe{}", "is not UTF-8"),
                                              (b"[1, 2]", "holds a JSON list"), (b"", "is not valid JSON")])
def test_an_index_that_is_not_a_json_object_is_one_error_naming_it(written, tmp_path, content, message):
    store = tampered(written, tmp_path, lambda i, s: None)
    (tmp_path / "store" / "index.json").write_bytes(content)
    with pytest.raises(DataError, match=message) as e:
        TokenStore(store)
    assert os.path.join(store, "index.json") in str(e.value)


def test_verify_reads_the_whole_store_against_the_hashes_written_with_it(written, tmp_path, tokenizer):
    good = TokenStore(str(written))
    assert good.verify()["shards"] == len(good.files) > 1
    store = tampered(written, tmp_path, lambda i, s: None)
    shard = tmp_path / "store" / "tokens-00001.bin"
    data = bytearray(shard.read_bytes())
    data[100] ^= 1  # same size: opening cannot tell, verifying can
    shard.write_bytes(bytes(data))
    opened = TokenStore(store)
    with pytest.raises(DataError, match="tokens-00001.bin changed after the store was written"):
        opened.verify()
    # a consistent forgery (hash rewritten) with a token outside the vocabulary
    import hashlib

    data[100:102] = np.array([60000], dtype=np.uint16).tobytes()
    shard.write_bytes(bytes(data))
    index = json.loads((tmp_path / "store" / "index.json").read_text())
    index["shards"][1]["sha256"] = hashlib.sha256(bytes(data)).hexdigest()
    (tmp_path / "store" / "index.json").write_text(json.dumps(index))
    with pytest.raises(DataError, match=f"token id 60000, outside the vocabulary of {len(tokenizer)}"):
        TokenStore(store).verify()


def test_a_shard_that_shrinks_while_open_is_named_not_broadcast(written, tmp_path):
    store = TokenStore(tampered(written, tmp_path, lambda i, s: None))
    shard = tmp_path / "store" / "tokens-00000.bin"
    shard.write_bytes(shard.read_bytes()[:1000])
    with pytest.raises(DataError, match="tokens-00000.bin ended at byte 1000"):
        store.read(0, 4000)


def test_an_unreadable_shard_or_log_is_named_at_opening(tmp_path, tokenizer):
    """Permissions: as an unprivileged user (root drops to nobody for the test, as the sandbox does),
    a shard or a run log the user cannot read is one error naming it at start-up."""
    import contextlib
    import tempfile

    from rpt.training.config import ConfigError
    from rpt.training.run_dir.file_checks import check_run_files

    @contextlib.contextmanager
    def unprivileged():
        if os.geteuid() != 0:
            yield
            return
        os.setegid(65534)
        os.seteuid(65534)
        try:
            yield
        finally:
            os.seteuid(0)
            os.setegid(0)

    root = tempfile.mkdtemp(dir="/tmp")  # /tmp: a path every user may traverse
    try:
        os.chmod(root, 0o755)
        store = os.path.join(root, "store")
        write_token_store(store, ["a b c " * 50], tokenizer, progress=False)
        for dirpath, dirs, files in os.walk(root):
            for name in dirs + files:
                os.chmod(os.path.join(dirpath, name), 0o755 if name in dirs else 0o644)
        os.chmod(os.path.join(store, "tokens-00000.bin"), 0)
        run = os.path.join(root, "run")
        os.makedirs(run, mode=0o755)
        with open(os.path.join(run, "train.log"), "w") as f:
            f.write("step 1/2 loss 1.0\n")
        os.chmod(os.path.join(run, "train.log"), 0)
        with unprivileged():
            with pytest.raises(DataError, match="tokens-00000.bin cannot be opened \\(Permission denied\\)"):
                TokenStore(store)
            with pytest.raises(ConfigError, match="train.log cannot be read \\(Permission denied\\)"):
                check_run_files(run)
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
