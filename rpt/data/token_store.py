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

import hashlib
import json
import os
import shutil
import stat
import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from rpt.data.tokenizer import backend_of, bos_id, encode_documents, eos_id, tokenizer_fingerprint
from rpt.errors import DataError

INDEX = "index.json"
FORMAT = "rpt-token-store"
VERSION = 1
SHARD_TOKENS = 1 << 28  # 512 MB of uint16 per file
BATCH_DOCUMENTS = 64
BATCH_CHARS = 1 << 20
_VERIFY_BLOCK = 16 << 20
RACY_NS = 2_000_000_000  # a shard written this close to a recording of its stamps is hashed, whatever its stamp


def token_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` when every id fits (vocabulary <= 65536), else ``uint32``."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


# ---- reading ------------------------------------------------------------------------------------
_FIX = "prepare it again (`python prepare_data.py --config X.yaml --out DIR`)"
DTYPES = ("uint16", "uint32")


def _index_error(index: str, problem: str) -> DataError:
    return DataError(f"{index} {problem}; the token store is damaged or was edited: {_FIX}")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_index(path: str) -> dict[str, Any]:
    """The checked ``index.json`` of the store at ``path``: its format, dtype and shard list."""
    index = os.path.join(path, INDEX)
    if not os.path.isfile(index):
        raise DataError(f"{path} is not a token store (no {INDEX}); write one with "
                        "`python prepare_data.py --config X.yaml --out DIR`")
    try:
        with open(index, "rb") as f:
            meta = json.loads(f.read().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise _index_error(index, f"is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise _index_error(index, f"is not valid JSON ({e})") from None
    except OSError as e:
        raise DataError(f"{index} cannot be read ({e.strerror or e})") from None
    if not isinstance(meta, dict):
        raise _index_error(index, f"holds a JSON {type(meta).__name__}, not the object a store's index is")
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise DataError(f"{path} is a token store of another format/version ({meta.get('format')} "
                        f"v{meta.get('version')}); prepare it again with prepare_data.py")
    if meta.get("dtype") not in DTYPES:
        raise _index_error(index, f"key 'dtype' = {meta.get('dtype')!r} is not one of {', '.join(DTYPES)}")
    shards = meta.get("shards")
    if not isinstance(shards, list):
        raise _index_error(index, "has no 'shards' list (each shard {\"file\": NAME, \"tokens\": N})")
    for i, shard in enumerate(shards):
        if not (isinstance(shard, dict) and isinstance(shard.get("file"), str) and _is_count(shard.get("tokens"))):
            raise _index_error(index, f"shard {i} ({str(shard)[:80]}) is not {{\"file\": NAME, \"tokens\": N >= 0}}")
    if "num_tokens" in meta and meta["num_tokens"] != sum(s["tokens"] for s in shards):
        raise _index_error(index, f"key 'num_tokens' = {meta['num_tokens']!r} is not the sum of its shards' tokens "
                                  f"({sum(s['tokens'] for s in shards)})")
    return meta


def shard_file(path: str, name: str, index: str) -> str:
    """The shard ``name`` of the store at ``path``: a file inside the store, never a path out of it
    (an absolute path, ``..``, or a link that leads outside is refused: a store from elsewhere must
    not make training read, and a model memorise, any other file of this machine)."""
    inside = (name and name == os.path.basename(name) and name not in (".", "..") and "\\" not in name
              and "\0" not in name and not os.path.isabs(name))
    full = os.path.join(path, name) if inside else name
    root = os.path.realpath(path)
    if not inside or os.path.dirname(os.path.realpath(full)) != root:
        raise DataError(f"{index} names the shard {name!r}, which is not a file inside the store {path} (shards are "
                        f"files beside index.json); refusing to read it: {_FIX}")
    return full


class TokenStore:
    """Read-only access to a store's flat token array by absolute token position.

    Opening one checks its index (:func:`read_index`) and that every shard is a file inside the
    store with exactly the bytes the index says (one ``stat`` per shard); :meth:`verify` checks the
    content against the SHA-256 recorded at writing (a full read, on request)."""

    def __init__(self, path: str):
        self.meta: dict[str, Any] = read_index(path)
        index = os.path.join(path, INDEX)
        self.path = path
        self.dtype = np.dtype(self.meta["dtype"])
        self.files = [shard_file(path, s["file"], index) for s in self.meta["shards"]]
        sizes = [s["tokens"] for s in self.meta["shards"]]
        for file, tokens in zip(self.files, sizes):
            try:
                st = os.stat(file)
                if not stat.S_ISREG(st.st_mode):
                    raise DataError(f"{file} is not a regular file, but {index} lists it as a shard: {_FIX}")
                os.close(os.open(file, os.O_RDONLY))  # readable now, not at the first batch that needs it
            except OSError as e:
                raise DataError(f"{file} cannot be opened ({e.strerror}), but {index} lists it: {_FIX}") from None
            if st.st_size != tokens * self.dtype.itemsize:
                raise DataError(f"{file} holds {st.st_size} bytes, but {index} says {tokens} {self.dtype.name} tokens "
                                f"({tokens * self.dtype.itemsize} bytes): the store changed after it was written; {_FIX}")
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
            if len(raw) != n * item:  # checked at opening: the file shrank since
                raise DataError(f"{self.files[shard]} ended at byte {offset * item + len(raw)}, before the {n} tokens "
                                f"at token {offset} its store's {INDEX} promises: it changed while the run read it; {_FIX}")
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

    def content_key(self) -> str:
        """The tokens this store holds, as 16 hex digits: its dtype and each shard's token count and SHA-256
        (recorded at writing; read here from the index, nothing hashed again). A store prepared again from
        an unchanged corpus has the same key, one of other tokens another. A store written before shards
        were hashed is keyed by its shards' sizes and the origin its index records (when it records one)."""
        shards = [(s["tokens"], s.get("sha256")) for s in self.meta["shards"]]
        parts: list[Any] = ["tokens-v1", self.meta["dtype"], shards]
        if not all(isinstance(sha, str) for _, sha in shards):
            parts.append(self.meta.get("identity"))
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def verify(self, threads: int | None = None) -> dict[str, Any]:
        """Read every shard in full: its SHA-256 must be the one recorded when it was written, and every
        token below the index's ``vocab_size``. A :class:`DataError` names the first shard that differs.
        Costs one read of the store (hashing runs at about 0.5 GB/s per core, shards in parallel), so
        it runs on request (``prepare_data.py --verify DIR``), never at start-up."""
        from concurrent.futures import ThreadPoolExecutor

        index = os.path.join(self.path, INDEX)
        shards = self.meta["shards"]
        if not all(isinstance(s.get("sha256"), str) for s in shards):
            raise DataError(f"{index} records no SHA-256 of its shards (written before stores recorded them): its "
                            f"content cannot be verified; {_FIX}")
        vocab = self.meta.get("vocab_size")

        def check(i: int) -> None:
            digest, top = self._hash_shard(i)
            if digest != shards[i]["sha256"]:
                raise DataError(f"{self.files[i]} changed after the store was written (its SHA-256 differs from the one "
                                f"in {index}); {_FIX}")
            if _is_count(vocab) and top >= vocab:
                raise DataError(f"{self.files[i]} holds token id {top}, outside the vocabulary of {vocab} its "
                                f"{INDEX} records; {_FIX}")

        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=max(1, min(threads or os.cpu_count() or 1, len(shards) or 1))) as pool:
            list(pool.map(check, range(len(shards))))  # hashlib and numpy release the GIL on large blocks
        seconds = time.perf_counter() - t0
        nbytes = self.num_tokens * self.dtype.itemsize
        return {"shards": len(shards), "bytes": nbytes, "seconds": seconds}

    def _hash_shard(self, i: int) -> tuple[str, int]:
        """Shard ``i``'s SHA-256 and largest token id (-1 when empty), from one full read."""
        digest, top = hashlib.sha256(), -1
        with open(self.files[i], "rb") as f:
            for block in iter(lambda: f.read(_VERIFY_BLOCK), b""):
                digest.update(block)
                if len(block) >= self.dtype.itemsize:
                    top = max(top, int(np.frombuffer(block, self.dtype).max()))
        return digest.hexdigest(), top

    def max_id(self) -> int | None:
        """The largest token id the store holds, as its index records it (None: written before stores
        recorded it)."""
        top = self.meta.get("max_id")
        return top if _is_count(top) else None

    def check_vocabulary(self, vocab: int) -> None:
        """Every id the store records below ``vocab`` (the model's embedding rows): a :class:`DataError`
        naming the store, the id and the vocabulary, before any step reads a batch."""
        top = self.max_id()
        if top is not None and top >= vocab:
            raise DataError(f"token store {self.path} holds token id {top}, outside the model's vocabulary of {vocab} "
                            "(ids 0.."
                            f"{vocab - 1}): it was written with another tokenizer or model; train with the tokenizer "
                            f"it was written with, or a model of at least {top + 1} embedding rows, or prepare it again")

    def stamps(self) -> dict[str, Any]:
        """What the file system says of each shard now (size, mtime, ctime in ns, inode; one ``stat``
        each) and when: a checkpoint records it, and :meth:`check_unchanged` compares a resume's against it."""
        shards = {}
        for s, file in zip(self.meta["shards"], self.files):
            st = os.stat(file)
            shards[s["file"]] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        return {"at_ns": time.time_ns(), "shards": shards}

    def check_unchanged(self, recorded: dict[str, Any], since: str) -> dict[str, Any]:
        """The shards hold the tokens they held when ``recorded`` (:meth:`stamps`) was taken: a shard
        whose stamp differs (any write changes its ctime, which no tool sets back), or whose ctime was
        within :data:`RACY_NS` of the recording (a write in the same tick could leave it equal: git's
        "racy" entries), is hashed in full and must match the SHA-256 of the index. A :class:`DataError`
        names the first that does not. Returns what was hashed: ``{"hashed": [files], "seconds": s}``
        (nothing, and one ``stat`` per shard, when no shard changed)."""
        from concurrent.futures import ThreadPoolExecutor

        index = os.path.join(self.path, INDEX)
        then, now = recorded.get("shards") or {}, self.stamps()["shards"]
        at = recorded.get("at_ns") if isinstance(recorded.get("at_ns"), int) else 0
        suspect = [i for i, s in enumerate(self.meta["shards"])
                   if not isinstance(then.get(s["file"]), list) or then[s["file"]] != now[s["file"]]
                   or then[s["file"]][2] >= at - RACY_NS]
        for i in suspect:
            if not isinstance(self.meta["shards"][i].get("sha256"), str):
                raise DataError(f"{self.files[i]} changed on disk since {since} (size, time or inode), and {index} records "
                                f"no SHA-256 to check its tokens by; {_FIX}, and start a new output_dir")
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=max(1, min(os.cpu_count() or 1, len(suspect) or 1))) as pool:
            digests = list(pool.map(lambda i: self._hash_shard(i)[0], suspect))
        for i, digest in zip(suspect, digests):
            if digest != self.meta["shards"][i]["sha256"]:
                raise DataError(f"{self.files[i]} was rewritten since {since} (its SHA-256 differs from the one in {index}): "
                                "the resumed run would read other tokens at its data_position; restore the shard, or "
                                "prepare the store again and start a new output_dir")
        return {"hashed": [self.files[i] for i in suspect], "seconds": time.perf_counter() - t0}

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
    num_proc = min(num_proc, docs.num_shards)  # a process per shard at most: more would only idle
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
            data = part.astype(self.dtype, copy=False).tobytes()
            self._file.write(data)
            self._hash.update(data)  # the shard's SHA-256 as it is written: verifying later needs no second pass here
            self.shards[-1]["tokens"] += len(part)
            if len(part):  # the largest id, checked against the model's vocabulary at start-up
                self.shards[-1]["max_id"] = max(self.shards[-1].get("max_id", 0), int(part.max()))

    def _next_file(self) -> None:
        self.close()
        name = f"tokens-{len(self.shards):05d}.bin"
        self._file = open(os.path.join(self.directory, name), "wb")
        self._hash = hashlib.sha256()
        self.shards.append({"file": name, "tokens": 0})

    def close(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None
            self.shards[-1]["sha256"] = self._hash.hexdigest()


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
    tmp = f"{path.rstrip('/')}.tmp-{os.getpid()}"  # a directory of shards (not write_atomic's file), renamed whole
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
            "max_id": max(sh.get("max_id", 0) for sh in writer.shards),
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
