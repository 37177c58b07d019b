"""Fixed chunks of a token store, addressed by global sample index.

Chunk ``c`` is tokens ``[c L, (c + 1) L)`` of the store (``L = seq_len + 1``: the inputs plus
the last target; a trailing remainder shorter than ``L`` is never read). Global sample ``i`` of a
run is chunk ``order(e, i mod N)`` of epoch ``e = i div N`` (:class:`ChunkOrder`): a pure
function of the seed and ``i``, so a rank reads exactly its own micro-batches, a resumed run
continues at the same sample in constant time, and memory does not depend on the corpus size.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from rpt.data.order import ChunkOrder
from rpt.data.token_store import TokenStore
from rpt.errors import DataError


class PackedStore:
    def __init__(self, store: TokenStore, chunk_len: int, seed: int):
        self.store, self.chunk_len, self.seed = store, chunk_len, seed
        self.num_chunks = store.num_tokens // chunk_len
        if self.num_chunks == 0:
            raise DataError(f"the token store {store.path} has {store.num_tokens} tokens, fewer than one chunk of "
                            f"{chunk_len}; add data or lower seq_len")
        self.order = ChunkOrder(self.num_chunks, seed)
        self.vocab: int | None = None  # the model's embedding rows: every row read is checked against it

    def limit_vocabulary(self, vocab: int) -> None:
        """Ids at or above ``vocab`` are refused: at once by the store's recorded largest id, and in every
        row read (a store written before it recorded one, or a shard edited since): one max per batch."""
        self.store.check_vocabulary(vocab)
        self.vocab = vocab

    def __len__(self) -> int:
        return self.num_chunks

    def chunk_ids(self, samples: Sequence[int]) -> np.ndarray:
        samples = np.asarray(samples, dtype=np.int64)
        epochs, places = np.divmod(samples, self.num_chunks)
        out = np.empty_like(samples)
        for e in np.unique(epochs):
            sel = epochs == e
            out[sel] = self.order(int(e), places[sel])
        return out

    def _read(self, chunks: Sequence[int]) -> torch.Tensor:
        rows = [self.store.read(int(c) * self.chunk_len, self.chunk_len) for c in chunks]
        if not rows:
            return torch.empty(0, self.chunk_len, dtype=torch.long)
        out = np.stack(rows)
        if self.vocab is not None and int(out.max()) >= self.vocab:
            row = int(np.argmax(out.max(axis=1)))
            raise DataError(f"token store {self.store.path} holds token id {int(out[row].max())} at token "
                            f"{int(chunks[row]) * self.chunk_len + int(np.argmax(out[row]))}, outside the model's vocabulary "
                            f"of {self.vocab}: the store changed or was written with another tokenizer; prepare it again")
        return torch.from_numpy(out)

    def rows(self, samples: Sequence[int]) -> torch.Tensor:
        """``[len(samples), chunk_len]`` int64 tokens of the given global sample indices."""
        return self._read(self.chunk_ids(samples))

    def sequential(self, count: int, start: int = 0) -> torch.Tensor:
        """Chunks ``start .. start + count`` in store order (validation: the same every time)."""
        return self._read(range(start, min(start + count, self.num_chunks)))


class StoreBatches:
    """The training loop's view of a :class:`PackedStore`: micro-batches by global index.

    Step ``t`` (1-based) consumes samples ``[p0 + (t-1-t0) B, p0 + (t-t0) B)`` with ``B`` the
    global batch and ``(t0, p0)`` the step and ``data_position`` the run resumed from (``(0, 0)``
    for a fresh run); its global micro-batch ``j`` is the ``j``-th run of ``micro_batch_size``
    samples in it. Resuming with another global batch (world size, micro-batch, accumulation)
    thus continues at the next unread sample: nothing is read twice or skipped.
    """

    def __init__(self, packed: PackedStore, micro_batch_size: int, global_batch: int):
        self.packed, self.micro_batch_size, self.global_batch = packed, micro_batch_size, global_batch
        self.start_step, self.start_position = 0, 0

    def __len__(self) -> int:
        return len(self.packed)

    def resume_at(self, step: int, data_position: int) -> None:
        """Continue after ``step``, at which the run had read ``data_position`` samples."""
        self.start_step, self.start_position = step, data_position

    def first_sample(self, step: int, micro: int) -> int:
        return self.start_position + (step - 1 - self.start_step) * self.global_batch + micro * self.micro_batch_size

    def micro_batch(self, step: int, micro: int) -> torch.Tensor:
        start = self.first_sample(step, micro)
        return self.packed.rows(range(start, start + self.micro_batch_size))

    def stamps(self) -> dict:
        """The store's shard stamps (:meth:`TokenStore.stamps`), recorded by each checkpoint."""
        return self.packed.store.stamps()

    def data_key(self) -> str:
        """The tokens read (:meth:`TokenStore.content_key`): a checkpoint records it beside its
        ``data_position``, which means a place in these tokens only."""
        return self.packed.store.content_key()

    def state_dict(self) -> dict:
        return {}  # the position is the trainer state's data_position

    def load_state_dict(self, state: dict) -> None:
        pass
