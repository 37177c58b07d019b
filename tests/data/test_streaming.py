"""Streamed training data: exact continuation after a resume (shuffled or not), no replay, split by rank."""

import json
import time
import types

import pytest
import torch

import rpt.data.sources as sources
from rpt.data import build_packed
from rpt.training.config import TrainConfig
from tests.helpers.tiny_models import tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("stream") / "corpus.jsonl"
    with open(path, "w") as f:
        for i in range(6000):
            f.write(json.dumps({"text": f"def f{i}(x):\n    return x * {i} + {i % 7}\n"}) + "\n")
    return str(path)


def config(corpus, **kw) -> TrainConfig:
    base = dict(model={"model_type": "llama"}, data={"path": corpus, "streaming": True}, val_fraction=0.0,
                seq_len=32, micro_batch_size=2, shuffle_buffer=0, data_workers=0, seed=3)
    base.update(kw)
    return TrainConfig(**base)


def take(batches, n: int, step0: int = 1) -> list[torch.Tensor]:
    return [batches.micro_batch(step0 + i, 0) for i in range(n)]


@pytest.mark.parametrize("workers, shuffle", [(0, 0), (1, 0), (0, 64)])
def test_resumed_stream_continues(corpus, tokenizer, workers, shuffle):
    cfg = config(corpus, data_workers=workers, shuffle_buffer=shuffle)
    ref = build_packed(cfg, "train", tokenizer)
    take(ref, 7)
    state = ref.state_dict()
    expected = take(ref, 5, 8)
    resumed = build_packed(cfg, "train", tokenizer)
    resumed.load_state_dict(state)
    got = take(resumed, 5, 8)
    assert all(torch.equal(a, b) for a, b in zip(expected, got))  # exact, with or without a shuffle window
    assert all(b.shape == (2, 33) and b.dtype == torch.long for b in got)


def test_stream_is_split_by_rank(corpus, tokenizer):
    cfg = config(corpus)
    firsts = [build_packed(cfg, "train", tokenizer, rank=r, world_size=2).micro_batch(1, r) for r in (0, 1)]
    assert not torch.equal(firsts[0], firsts[1])


def test_resume_does_not_replay_the_stream(corpus, tokenizer, monkeypatch):
    """Documents parsed between load_state_dict and the first batch, at data positions 10 and 1000
    micro-batches: bounded by one shard (here 16 KB), not by the position."""
    monkeypatch.setattr(sources, "SHARD_BYTES", 16 << 10)
    parsed = {"n": 0}

    def counting_loads(line):
        parsed["n"] += 1
        return json.loads(line)

    monkeypatch.setattr(sources, "json", types.SimpleNamespace(loads=counting_loads, JSONDecodeError=json.JSONDecodeError))
    cfg = config(corpus)
    costs = {}
    for position in (10, 1000):
        batches = build_packed(cfg, "train", tokenizer)
        take(batches, position)
        state = batches.state_dict()
        consumed = parsed["n"]
        resumed = build_packed(cfg, "train", tokenizer)
        parsed["n"] = 0
        t0 = time.perf_counter()
        resumed.load_state_dict(state)
        resumed.micro_batch(position + 1, 0)
        costs[position] = (parsed["n"], time.perf_counter() - t0, consumed)
    (few, t_few, _), (many, t_many, consumed) = costs[10], costs[1000]
    per_shard = (16 << 10) // 40  # lines of ~40 bytes in a 16 KB shard
    assert consumed > 5 * per_shard  # the far position is several shards into the file
    print("resume costs (documents parsed, seconds, documents consumed before):", costs)
    assert many <= per_shard + 10 and few <= per_shard + 10, costs
    assert t_many < 3 * t_few + 0.5, costs


def test_a_bad_line_read_in_a_worker_is_one_line_naming_it(tmp_path, tokenizer):
    """A DataError raised in a DataLoader worker comes back with the worker's traceback as its text
    (torch re-raises it so); the trainer reports the original one line, file and line named."""
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"text": "def f(x):\n    return x\n" * 5}) + "\n" + '{"text": {"oops": 1}}\n')
    batches = build_packed(config(str(path), data_workers=1), "train", tokenizer)
    with pytest.raises(sources.DataError) as e:
        take(batches, 3)
    assert str(e.value).startswith(f"{path} line 2: the text field 'text' is an object") and "\n" not in str(e.value)
