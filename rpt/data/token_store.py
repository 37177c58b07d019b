"""A token store: tokenised documents on disk, read by position, written once and atomically.

Layout (a directory)::

    index.json          {"format": "rpt-token-store", "dtype": "uint16", "num_tokens": N,
                         "shards": [{"file": "tokens-00000.bin", "tokens": n0}, ...], ...}
    tokens-00000.bin    raw little-endian token ids, documents joined by EOS (np.memmap-able)
    tokenizer/          the tokenizer that wrote it

As in nanoGPT's ``prepare.py`` and Megatron's indexed datasets, the tokens of all documents
form one flat array (``uint16`` when the vocabulary fits, else ``uint32``) split into shard
files; there is no per-document index, because training cuts the stream into fixed chunks of
``seq_len + 1`` tokens (:mod:`rpt.data.packed`) whatever the document boundaries. Readers use
``os.pread`` (no mapping stays open, so a process's resident memory does not grow with the
pages it has read; nanoGPT recreates its ``np.memmap`` per batch for the same reason);
:meth:`TokenStore.memmap` maps a shard for inspection.

The writer hands the document stream's shards to ``num_proc`` processes (as
``datasets.map(num_proc=...)`` does; written in shard order, so the store is the same for any
count), streams into the shard files with bounded memory, and renames a finished temporary
directory into place: a store exists whole or not at all.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from rpt.data.errors import DataError
from rpt.data.tokenizer import backend_of, bos_id, encode_documents, eos_id, tokenizer_fingerprint

INDEX = "index.json"
FORMAT = "rpt-token-store"
VERSION = 1
SHARD_TOKENS = 1 << 28  # 512 MB of uint16 per file
BATCH_DOCUMENTS = 64
BATCH_CHARS = 1 << 20


def token_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` when every id fits (vocabulary <= 65536), else ``uint32``."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


# ---- reading ------------------------------------------------------------------------------------
class TokenStore:
    """Read-only access to a store's flat token array by absolute token position."""

    def __init__(self, path: str):
        index = os.path.join(path, INDEX)
        if not os.path.isfile(index):
            raise DataError(f"{path} is not a token store (no {INDEX}); write one with "
                            "`python prepare_data.py --config X.yaml --out DIR`")
        with open(index) as f:
            self.meta: dict[str, Any] = json.load(f)
        if self.meta.get("format") != FORMAT or self.meta.get("version") != VERSION:
            raise DataError(f"{path} is a token store of another format/version ({self.meta.get('format')} "
                            f"v{self.meta.get('version')}); prepare it again with prepare_data.py")
        self.path = path
        self.dtype = np.dtype(self.meta["dtype"])
        self.files = [os.path.join(path, s["file"]) for s in self.meta["shards"]]
        sizes = [int(s["tokens"]) for s in self.meta["shards"]]
        self.starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        self.num_tokens = int(self.starts[-1])
        self._fds: dict[int, int] = {}

    def __len__(self) -> int:
        return self.num_tokens

    def __getstate__(self):
        return {**self.__dict__, "_fds": {}}  # descriptors do not cross processes

    def _fd(self, shard: int) -> int:
        if shard not in self._fds:
            self._fds[shard] = os.open(self.files[shard], os.O_RDONLY)
        return self._fds[shard]

    def read(self, start: int, count: int) -> np.ndarray:
        """Tokens ``[start, start + count)`` as int64 (a range may span shard files)."""
        if start < 0 or start + count > self.num_tokens:
            raise IndexError(f"tokens [{start}, {start + count}) outside the store's {self.num_tokens}")
        out = np.empty(count, dtype=np.int64)
        at, item = 0, self.dtype.itemsize
        shard = int(np.searchsorted(self.starts, start, side="right")) - 1
        while at < count:
            offset = start + at - int(self.starts[shard])
            n = min(count - at, int(self.starts[shard + 1]) - (start + at))
            raw = os.pread(self._fd(shard), n * item, offset * item)
            out[at : at + n] = np.frombuffer(raw, dtype=self.dtype)
            at, shard = at + n, shard + 1
        return out

    def memmap(self, shard: int = 0) -> np.memmap:
        return np.memmap(self.files[shard], dtype=self.dtype, mode="r")

    def check_tokenizer(self, tokenizer) -> None:
        theirs, ours = self.meta.get("tokenizer_fingerprint"), tokenizer_fingerprint(tokenizer)
        if theirs != ours:
            raise DataError(f"token store {self.path} was written with another tokenizer ({theirs}, this run's is "
                            f"{ours}); train with its tokenizer ({os.path.join(self.path, 'tokenizer')}) or prepare it again")
        if self.meta.get("bos_id") != bos_id(tokenizer):  # stores written before BOS was packed have none
            raise DataError(f"token store {self.path} holds documents with BOS id {self.meta.get('bos_id')} but this run's "
                            f"tokenizer puts {bos_id(tokenizer)} before a text; prepare the store again")

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


# ---- writing ------------------------------------------------------------------------------------
def as_documents(docs):
    """A ``datasets.IterableDataset`` with a ``text`` column (a list of strings is wrapped)."""
    import datasets

    if isinstance(docs, datasets.IterableDataset):
        return docs
    texts = list(docs)
    if not texts:
        return datasets.IterableDataset.from_generator(_no_documents)
    return datasets.Dataset.from_dict({"text": texts}).to_iterable_dataset(num_shards=min(len(texts), 64))


def _no_documents():
    yield from ()


def _shard_arrays(docs, index: int, backend, specials: tuple[int, int | None], dtype: np.dtype) -> Iterator[tuple[np.ndarray, int]]:
    """Token arrays of shard ``index`` of ``docs``, a batch of documents at a time (``specials``: EOS, BOS)."""
    shard = docs.shard(num_shards=docs.num_shards, index=index, contiguous=True) if docs.num_shards > 1 else docs
    for batch in _batches((ex["text"] for ex in shard), BATCH_DOCUMENTS):
        yield encode_documents(backend, batch, specials[0], dtype, bos=specials[1]), len(batch)


_WORKER: tuple | None = None


def _worker_init(docs, tokenizer_json: str, specials: tuple[int, int | None], dtype: str) -> None:
    global _WORKER
    from tokenizers import Tokenizer

    _WORKER = (docs, Tokenizer.from_str(tokenizer_json), specials, np.dtype(dtype))


def _worker_shard(index: int) -> tuple[np.ndarray, int]:
    docs, backend, specials, dtype = _WORKER
    parts = list(_shard_arrays(docs, index, backend, specials, dtype))
    return np.concatenate([a for a, _ in parts]) if parts else np.empty(0, dtype), sum(n for _, n in parts)


def _batches(texts: Iterable[str], size: int, max_chars: int = BATCH_CHARS) -> Iterator[list[str]]:
    """Runs of at most ``size`` documents and (past the first) ``max_chars`` characters: the
    tokenizer's per-token bookkeeping for a batch is transient memory, so it stays bounded."""
    batch: list[str] = []
    chars = 0
    for t in texts:
        if batch and (len(batch) == size or chars + len(t) > max_chars):
            yield batch
            batch, chars = [], 0
        batch.append(t)
        chars += len(t)
    if batch:
        yield batch


def _encoded(docs, tokenizer, dtype: np.dtype, num_proc: int) -> Iterator[tuple[np.ndarray, int]]:
    """Token arrays in document order: shard after shard, each tokenised by one of ``num_proc``
    processes (as ``datasets.map(num_proc=...)`` splits a dataset), written in shard order, so
    the store is the same for any ``num_proc``."""
    backend, specials = backend_of(tokenizer), (eos_id(tokenizer), bos_id(tokenizer))
    if num_proc <= 1:
        for index in range(docs.num_shards):
            yield from _shard_arrays(docs, index, backend, specials, dtype)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawn: the parent may hold threads (tokenizers, torch) that a fork would copy mid-lock.
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(num_proc, mp_context=ctx, initializer=_worker_init,
                             initargs=(docs, backend.to_str(), specials, dtype.str)) as pool:
        pending: deque = deque()
        shards = iter(range(docs.num_shards))
        try:
            for index in shards:
                pending.append(pool.submit(_worker_shard, index))
                if len(pending) >= 2 * num_proc:  # bounded look-ahead: memory does not grow with the corpus
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()


class _ShardWriter:
    def __init__(self, directory: str, dtype: np.dtype, shard_tokens: int):
        self.directory, self.dtype, self.shard_tokens = directory, dtype, shard_tokens
        self.shards: list[dict[str, Any]] = []
        self._file = None

    def write(self, tokens: np.ndarray) -> None:
        while len(tokens):
            if self._file is None or self.shards[-1]["tokens"] == self.shard_tokens:
                self._next_file()
            room = self.shard_tokens - self.shards[-1]["tokens"]
            part, tokens = tokens[:room], tokens[room:]
            self._file.write(part.astype(self.dtype, copy=False).tobytes())
            self.shards[-1]["tokens"] += len(part)

    def _next_file(self) -> None:
        self.close()
        name = f"tokens-{len(self.shards):05d}.bin"
        self._file = open(os.path.join(self.directory, name), "wb")
        self.shards.append({"file": name, "tokens": 0})

    def close(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None


def write_token_store(
    path: str,
    docs,
    tokenizer,
    *,
    num_proc: int = 1,
    max_tokens: int | None = None,
    shard_tokens: int = SHARD_TOKENS,
    meta: dict[str, Any] | None = None,
    progress: bool = True,
    desc: str = "tokenizing",
) -> dict[str, Any]:
    """Tokenise ``docs`` (a ``datasets.IterableDataset`` with a ``text`` column, or a list of
    strings) into a new store at ``path``; returns its index (with ``tokens_per_s``).

    ``max_tokens`` stops after that many tokens (the last document is cut). If ``path``
    already exists when the store is finished (another process wrote it), that one is kept.
    """
    from tqdm.auto import tqdm

    docs = as_documents(docs)
    dtype = token_dtype(len(tokenizer))
    tmp = f"{path.rstrip('/')}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    writer = _ShardWriter(tmp, dtype, shard_tokens)
    bar = tqdm(total=max_tokens, unit="tok", unit_scale=True, desc=desc, disable=not progress, dynamic_ncols=True)
    num_tokens = num_docs = 0
    t0 = time.perf_counter()
    stream = _encoded(docs, tokenizer, dtype, num_proc)
    try:
        for tokens, docs in stream:
            if max_tokens is not None:
                tokens = tokens[: max_tokens - num_tokens]
            writer.write(tokens)
            num_tokens, num_docs = num_tokens + len(tokens), num_docs + docs
            bar.update(len(tokens))
            if max_tokens is not None and num_tokens >= max_tokens:
                break
        stream.close()  # stops the tokenising processes when max_tokens cut the stream short
        writer.close()
        seconds = time.perf_counter() - t0
        bar.close()
        if num_tokens == 0:
            raise DataError(f"no tokens to write into {path}: the data ({(meta or {}).get('source', '?')}) has no documents; "
                            "check the source, text_field and val_fraction")
        index = {
            "format": FORMAT, "version": VERSION, "dtype": dtype.name, "num_tokens": num_tokens,
            "num_documents": num_docs, "shards": writer.shards, "vocab_size": len(tokenizer),
            "eos_id": eos_id(tokenizer), "bos_id": bos_id(tokenizer), "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
            "num_proc": num_proc, "seconds": round(seconds, 3), "tokens_per_s": round(num_tokens / max(seconds, 1e-9), 1),
            **(meta or {}),
        }
        tokenizer.save_pretrained(os.path.join(tmp, "tokenizer"))
        with open(os.path.join(tmp, INDEX), "w") as f:
            json.dump(index, f, indent=2, default=str)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.rename(tmp, path)
        except OSError:  # someone else finished the same store first: keep theirs
            if not os.path.isfile(os.path.join(path, INDEX)):
                raise
            shutil.rmtree(tmp, ignore_errors=True)
        return index
    except BaseException:
        stream.close()
        writer.close()
        bar.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
