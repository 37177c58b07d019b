"""Streaming training data: this rank's documents, tokenised and packed in background workers.

The order of the documents is a pure function of ``(seed, epoch, position)``, owned by each
*reader* -- one per (rank, DataLoader worker), ``R = world_size x max(1, data_workers)`` in all:

* **shards**: with at least ``R`` shards (JSONL byte ranges, parquet row groups, files), reader
  ``r`` reads shards ``r, r + R, ...`` in an order permuted per epoch by ``(seed, epoch, r)``;
  with fewer, every reader reads every shard (in an order seeded by ``(seed, epoch)``) and keeps
  document ``j`` of a shard when ``j mod R = r``;
* **shuffle**: the reader's documents are cut into windows of ``shuffle_buffer`` documents and
  each window is permuted by ``(seed, epoch, r, window)`` (0: stream order);
* **epochs**: each reader counts its own epochs (``datasets`` keeps its epoch in memory shared by
  all workers, which made workers skip each other's epochs, so its ``set_epoch`` is not used).

A reader's state is ``(epoch, window, cursor of the window's first document, documents of the
window already read, tokens not yet packed)``: a resume re-reads the window (at most
``shuffle_buffer`` documents and the shard it starts in, never the data before it), permutes it
the same way and continues **exactly** where the uninterrupted run would have. ``torchdata``'s
``StatefulDataLoader`` runs the readers in its workers and saves every worker's state with each
batch. A checkpoint of another world size or worker count is refused with one line: the readers
would not be the same.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from rpt.data.tokenizer import backend_of, bos_id, encode_documents, eos_id
from rpt.errors import DataError

STATE_VERSION = 2


def reader_shards(num_shards: int, readers: int, reader: int) -> tuple[list[int], int]:
    """The shards reader ``reader`` of ``readers`` reads and the stride of the documents it keeps
    in each (1: all of them; ``readers``: one in ``readers``, at offset ``reader``)."""
    if num_shards >= readers:
        return list(range(reader, num_shards, readers)), 1
    return list(range(num_shards)), readers


class PackedStream(torch.utils.data.IterableDataset):
    """Documents -> tokens (EOS-joined) -> chunks of ``chunk_len``, epoch after epoch.

    ``docs`` is a ``datasets.IterableDataset`` of ``{"text": str}`` (the whole source, not split
    by rank: the split is this class's, see the module doc).
    """

    def __init__(self, docs, tokenizer, chunk_len: int, *, seed: int = 0, shuffle_buffer: int = 0,
                 rank: int = 0, world_size: int = 1):
        super().__init__()
        self.docs, self.chunk_len = docs, chunk_len
        self.seed, self.shuffle_buffer, self.rank, self.world_size = seed, shuffle_buffer, rank, world_size
        self.backend, self.eos, self.bos = backend_of(tokenizer), eos_id(tokenizer), bos_id(tokenizer)
        self._state: dict[str, Any] | None = None  # the position after the last chunk yielded

    # ---- who am I --------------------------------------------------------------------------------
    def reader(self) -> tuple[int, int]:
        """``(reader, readers)`` of the calling process (a DataLoader worker or the main one)."""
        info = torch.utils.data.get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        return self.rank * workers + worker, self.world_size * workers

    # ---- the document order ---------------------------------------------------------------------
    def shard_order(self, epoch: int, reader: int, readers: int) -> tuple[list[int], int, int]:
        shards, stride = reader_shards(self.docs.num_shards, readers, reader)
        # Readers that share the shards (stride > 1) must walk them in the same order.
        key = [self.seed, epoch, reader if stride == 1 else readers, 0]
        order = [shards[i] for i in np.random.default_rng(key).permutation(len(shards))]
        return order, stride, reader if stride > 1 else 0

    def _shard_texts(self, shard: int) -> Iterator[str]:
        # The examples iterable of one shard, read directly: IterableDataset.__iter__ would split
        # it again between the DataLoader workers (the split here is already per worker).
        ex = self.docs._ex_iterable.shard_data_sources(num_shards=self.docs.num_shards, index=shard, contiguous=True)
        for _key, example in ex:
            yield example["text"]

    def _documents_from(self, epoch: int, cursor: tuple[int, int], reader: int, readers: int):
        """``((shard place, documents into the shard), text)`` of the reader's epoch from ``cursor``."""
        order, stride, offset = self.shard_order(epoch, reader, readers)
        place, skip = cursor
        for p in range(place, len(order)):
            for j, text in enumerate(self._shard_texts(order[p])):
                if j >= skip and j % stride == offset:
                    yield (p, j + 1), text
            skip = 0

    def _epoch_texts(self, state: dict[str, Any], reader: int, readers: int) -> Iterator[tuple[dict, str]]:
        """``(position after it, text)`` of the reader's documents from ``state`` to the epoch's end."""
        epoch, window, cursor, taken = state["epoch"], state["window"], tuple(state["cursor"]), state["taken"]
        stream = self._documents_from(epoch, cursor, reader, readers)
        size = max(1, self.shuffle_buffer)
        while True:
            docs = list(itertools.islice(stream, size))
            if not docs:
                return
            texts = [t for _, t in docs]
            if self.shuffle_buffer > 0:
                perm = np.random.default_rng([self.seed, epoch, reader, window, 1]).permutation(len(texts))
                texts = [texts[i] for i in perm]
            for i in range(taken, len(texts)):
                yield {"epoch": epoch, "window": window, "cursor": list(cursor), "taken": i + 1}, texts[i]
            cursor, window, taken = docs[-1][0], window + 1, 0

    # ---- packing ------------------------------------------------------------------------------------
    def __iter__(self):
        reader, readers = self.reader()
        state = self._state or {"epoch": 0, "window": 0, "cursor": [0, 0], "taken": 0, "buffer": np.empty(0, np.int64)}
        buf = np.asarray(state["buffer"], dtype=np.int64)
        while True:
            read = False
            for position, text in self._epoch_texts(state, reader, readers):
                read = True
                buf = np.concatenate([buf, encode_documents(self.backend, [text], self.eos, bos=self.bos)])
                while len(buf) >= self.chunk_len:
                    chunk, buf = buf[: self.chunk_len], buf[self.chunk_len :]
                    self._state = {**position, "buffer": buf, "reader": [reader, readers]}
                    yield torch.from_numpy(chunk.copy())
            if not read and state["taken"] == 0 and tuple(state["cursor"]) == (0, 0):
                return  # a reader with no documents at all: its worker ends here
            state = {"epoch": state["epoch"] + 1, "window": 0, "cursor": [0, 0], "taken": 0}

    def state_dict(self) -> dict[str, Any]:
        if self._state is None:
            return {}
        s = self._state
        return {"epoch": s["epoch"], "window": s["window"], "cursor": torch.tensor(s["cursor"]), "taken": s["taken"],
                "buffer": torch.from_numpy(s["buffer"].copy()), "reader": torch.tensor(s["reader"])}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            self._state = None
            return
        self._state = {"epoch": int(state["epoch"]), "window": int(state["window"]),
                       "cursor": [int(c) for c in state["cursor"]], "taken": int(state["taken"]),
                       "buffer": state["buffer"].numpy().astype(np.int64), "reader": [int(r) for r in state["reader"]]}


class StreamBatches:
    """This rank's micro-batches from a :class:`PackedStream`, prepared by ``workers`` processes."""

    def __init__(self, stream: PackedStream, micro_batch_size: int, workers: int, rank: int = 0):
        from torchdata.stateful_dataloader import StatefulDataLoader

        self.stream, self.rank, self.workers = stream, rank, workers
        self.loader = StatefulDataLoader(
            stream, batch_size=micro_batch_size, num_workers=workers,
            prefetch_factor=2 if workers > 0 else None, persistent_workers=False,
        )
        self._iter = None
        self.vocab: int | None = None  # the model's embedding rows: every batch is checked against it

    def limit_vocabulary(self, vocab: int) -> None:
        self.vocab = vocab

    def micro_batch(self, step: int, micro: int) -> torch.Tensor:
        """The next micro-batch of this rank's stream (``step``/``micro`` name it in errors)."""
        if self._iter is None:
            self._iter = iter(self.loader)
        try:
            batch = next(self._iter)
            if self.vocab is not None and batch.numel() and int(batch.max()) >= self.vocab:
                raise DataError(f"the streamed data holds token id {int(batch.max())} (step {step}, micro-batch {micro}), "
                                f"outside the model's vocabulary of {self.vocab}: the tokenizer numbers tokens past the "
                                "model's embedding; use a model with more rows or the tokenizer it was trained with")
            return batch
        except DataError as e:  # raised in a worker: torch re-raises it with the worker's traceback as its text
            text = str(e).strip().splitlines()
            raise DataError(text[-1].split("DataError: ", 1)[-1] if "Original Traceback" in str(e) else str(e)) from None
        except StopIteration:
            raise DataError(f"the streaming data of rank {self.rank} produced no chunk of {self.stream.chunk_len} tokens "
                            f"(step {step}, micro-batch {micro}); check the source, or use fewer processes than it has "
                            "shards, or lower seq_len") from None

    def resume_at(self, step: int, data_position: int) -> None:
        """Nothing to do: the position is in the loader's state (:meth:`load_state_dict`)."""

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "data_workers": self.workers, "world_size": self.stream.world_size,
                "shuffle_buffer": self.stream.shuffle_buffer, "loader": self.loader.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise DataError("the checkpoint's streamed-data position is of an older format (its document order "
                            "differs); resume=none to start over")
        for key, now in (("data_workers", self.workers), ("world_size", self.stream.world_size),
                         ("shuffle_buffer", self.stream.shuffle_buffer)):
            if int(state[key]) != now:
                raise DataError(f"the checkpoint's streamed data was read with {key}={int(state[key])} but this run has "
                                f"{key}={now}; each (rank, worker) reads its own documents, so resume with "
                                f"{key}={int(state[key])} (or resume=none)")
        self.loader.load_state_dict(state["loader"])
        self._iter = None
