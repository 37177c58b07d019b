"""The streamed document order, read as a sequence of document ids: every epoch reads every
document once in every (rank, worker) split, and a resume from any position -- across epoch
boundaries, with any shuffle buffer -- continues with exactly the documents the uninterrupted
run reads. Each document is exactly one chunk (5 tokens + EOS), so a chunk names its document."""

from collections import Counter

import pytest

from rpt.data import build_packed
from rpt.errors import DataError
from rpt.training.config import TrainConfig
from tests.helpers.tiny_models import tiny_tokenizer
from tests.helpers.train_helpers import write_jsonl

DOC_TOKENS = 5


def doc_text(i: int) -> str:
    return f"{i // 100}|{i // 10 % 10}|{i % 10}"  # 5 tokens for every i with the tiny tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    tok = tiny_tokenizer()
    assert {len(tok(doc_text(i), add_special_tokens=False).input_ids) for i in range(40)} == {DOC_TOKENS}
    return tok


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """40 documents as 4 files (4 shards) and as 1 file (1 shard: fewer shards than readers)."""
    root = tmp_path_factory.mktemp("order")
    for f in range(4):
        write_jsonl(root / f"part-{f}.jsonl", [doc_text(10 * f + j) for j in range(10)])
    write_jsonl(root / "one.jsonl", [doc_text(i) for i in range(40)])
    return {4: str(root / "part-*.jsonl"), 1: str(root / "one.jsonl")}


def config(path, **kw) -> TrainConfig:
    base = dict(model={"model_type": "llama"}, data={"path": path, "streaming": True}, val_fraction=0.0,
                seq_len=DOC_TOKENS, micro_batch_size=1, data_workers=0, seed=5)
    base.update(kw)
    return TrainConfig(**base)


def read_ids(batches, tokenizer, n: int) -> list[int]:
    ids = []
    for k in range(n):
        row = batches.micro_batch(k + 1, 0)[0]
        assert int(row[-1]) == tokenizer.eos_token_id  # one whole document per chunk
        ids.append(int(tokenizer.decode(row[:-1]).replace("|", "")))
    return ids


@pytest.mark.parametrize("shards", [4, 1])
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_every_epoch_reads_every_document_once(corpora, tokenizer, shards, workers):
    ids = read_ids(build_packed(config(corpora[shards], data_workers=workers), "train", tokenizer), tokenizer, 160)
    for e in range(4):
        assert sorted(ids[40 * e : 40 * (e + 1)]) == list(range(40)), (e, ids)
    assert ids[:40] != ids[40:80]  # a new permutation every epoch
    assert ids[:40] != sorted(ids[:40])  # the default shuffle buffer shuffles


def test_two_ranks_two_workers_split_every_epoch(corpora, tokenizer):
    per_rank = [read_ids(build_packed(config(corpora[4], data_workers=2), "train", tokenizer, rank=r, world_size=2),
                         tokenizer, 60) for r in (0, 1)]
    for e in range(3):
        epoch = [i for ids in per_rank for i in ids[20 * e : 20 * (e + 1)]]
        assert sorted(epoch) == list(range(40)), (e, per_rank)  # the ranks split the documents, no overlap


# Every (world, workers, cut) with a small buffer (3: a part-filled buffer in the saved state); no buffer (0)
# and one larger than the corpus (10_000) each with 0, 1 and 2 workers, 1 and 2 ranks, a cut within an epoch
# and one across an epoch's end.
RESUME_CASES = [*((world, workers, cut, 3) for world, workers, cut in
                  [(1, 2, 25), (1, 2, 50), (1, 0, 47), (1, 1, 30), (2, 2, 25), (2, 2, 9), (2, 1, 13)]),
                (1, 0, 47, 0), (1, 2, 50, 0), (2, 1, 13, 0),
                (1, 0, 47, 10_000), (1, 1, 30, 10_000), (2, 2, 25, 10_000)]


@pytest.mark.parametrize("world, workers, cut, buffer", RESUME_CASES)
def test_resume_continues_exactly(corpora, tokenizer, buffer, world, workers, cut):
    """Cut at micro-batch ``cut`` (epochs are 40 / world documents long per rank), resume, and read on."""
    cfg = config(corpora[4], data_workers=workers, shuffle_buffer=buffer)
    for rank in range(world):
        ref = build_packed(cfg, "train", tokenizer, rank, world)
        first = read_ids(ref, tokenizer, cut)
        state = ref.state_dict()
        expected = read_ids(ref, tokenizer, 50)
        resumed = build_packed(cfg, "train", tokenizer, rank, world)
        resumed.load_state_dict(state)
        assert read_ids(resumed, tokenizer, 50) == expected, (rank, first)
        counts = Counter(first + expected)  # the first epochs of this rank: each document equally often
        assert max(counts.values()) - min(counts.values()) <= 1


def test_resume_with_other_workers_is_one_clear_error(corpora, tokenizer):
    ref = build_packed(config(corpora[4], data_workers=2), "train", tokenizer)
    read_ids(ref, tokenizer, 3)
    state = ref.state_dict()
    other = build_packed(config(corpora[4], data_workers=1), "train", tokenizer)
    with pytest.raises(DataError, match="data_workers=2 but this run has data_workers=1"):
        other.load_state_dict(state)
