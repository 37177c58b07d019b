"""Streaming training data: this rank's documents, tokenised and packed in background workers.

:class:`PackedStream` turns a rank's document stream (already split by
``datasets.distributed.split_dataset_by_node``) into chunks of ``seq_len + 1`` tokens; it runs
inside ``torchdata``'s ``StatefulDataLoader`` workers, which split the rank's shards between
them, tokenise ahead of the training step (``prefetch_factor``) and report their state with
every batch. :class:`StreamBatches` hands the training loop one micro-batch at a time and
saves/restores the whole pipeline's position: the ``datasets`` stream position (shard and
example within it), the epoch and the not-yet-packed tokens. Resuming re-reads at most the
current shard up to the saved example; it never re-tokenises what came before.

What "exact" means here. With ``shuffle_buffer: 0`` a resumed run sees exactly the chunks the
uninterrupted run would have seen. With a shuffle buffer (the default), ``datasets`` does not
save the buffer's contents: the documents in it at the checkpoint (at most ``shuffle_buffer``
per worker) are skipped, and the order after the resume differs from the uninterrupted run's,
though no document is seen twice within an epoch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rpt.data.errors import DataError
from rpt.data.tokenizer import backend_of, encode_documents, eos_id


class PackedStream(torch.utils.data.IterableDataset):
    """Documents -> tokens (EOS-joined) -> chunks of ``chunk_len``, epoch after epoch."""

    def __init__(self, docs, tokenizer, chunk_len: int):
        super().__init__()
        self.docs, self.chunk_len = docs, chunk_len
        self.backend, self.eos = backend_of(tokenizer), eos_id(tokenizer)
        self._buffer = np.empty(0, dtype=np.int64)  # tokens read but not yet yielded

    def __iter__(self):
        buf = self._buffer
        while True:
            produced = False
            for example in self.docs:
                buf = np.concatenate([buf, encode_documents(self.backend, [example["text"]], self.eos)])
                while len(buf) >= self.chunk_len:
                    chunk, buf = buf[: self.chunk_len], buf[self.chunk_len :]
                    self._buffer = buf  # the state a checkpoint taken after this chunk records
                    produced = True
                    yield torch.from_numpy(chunk.copy())
                self._buffer = buf
            if not produced:  # an empty stream (or a worker without shards) ends here
                return
            self.docs.set_epoch(self.docs.epoch + 1)

    def state_dict(self) -> dict[str, Any]:
        return {"docs": self.docs.state_dict(), "buffer": torch.from_numpy(self._buffer.copy())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.docs.set_epoch(int(state["docs"]["epoch"]))
        self.docs.load_state_dict(state["docs"])
        self._buffer = state["buffer"].numpy().astype(np.int64)


class StreamBatches:
    """This rank's micro-batches from a :class:`PackedStream`, prepared by ``workers`` processes."""

    def __init__(self, stream: PackedStream, micro_batch_size: int, workers: int, rank: int = 0):
        from torchdata.stateful_dataloader import StatefulDataLoader

        self.stream, self.rank = stream, rank
        self.loader = StatefulDataLoader(
            stream, batch_size=micro_batch_size, num_workers=workers,
            prefetch_factor=2 if workers > 0 else None, persistent_workers=False,
        )
        self._iter = None

    def micro_batch(self, step: int, micro: int) -> torch.Tensor:
        """The next micro-batch of this rank's stream (``step``/``micro`` name it in errors)."""
        if self._iter is None:
            self._iter = iter(self.loader)
        try:
            return next(self._iter)
        except StopIteration:
            raise DataError(f"the streaming data of rank {self.rank} produced no chunk of {self.stream.chunk_len} tokens "
                            f"(step {step}, micro-batch {micro}); check the source, or use fewer processes than it has "
                            "shards, or lower seq_len") from None

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)
        self._iter = None
