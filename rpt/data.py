"""Training data: sources -> texts (``datasets``) -> tokens -> packed ``seq_len + 1`` chunks.

Sources (a single mapping or a list, each optionally with ``weight`` for a mixture):

* ``{"stdlib": {"max_files": N}}`` -- the Python standard library source of the running
  interpreter: real code on every machine, split into train / validation **by file**.
* ``{"path": "corpus.jsonl" | "*.txt" | "*.parquet", "text_field": "text"}`` -- local files.
* ``{"hub": "name", "config": C, "split": "train", "text_field": "text", "streaming": true}``.

Documents are tokenised with ``Dataset.map``, joined with EOS between documents and cut into
chunks of ``seq_len + 1`` tokens (inputs plus the last target). A map-style corpus is cached as a
``.npy`` file keyed by its source, tokenizer and length, and read in an order fixed by the seed:
global sample ``i`` is chunk ``perm_e[i mod N]`` of epoch ``e = i div N``. The *data position*
saved in checkpoints is the number of samples consumed, so a resumed run continues exactly.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import sysconfig
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

STDLIB_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "lib2to3"}
EOS_TOKEN = "<|endoftext|>"


class DataError(ValueError):
    """A data source that cannot be read: the message names it and the fix."""


# ---- texts -----------------------------------------------------------------------------------
def stdlib_files(max_files: int | None = None) -> list[str]:
    """The ``.py`` files of the running interpreter's standard library, sorted, tests excluded."""
    root = sysconfig.get_paths()["stdlib"]
    files = []
    for dirpath, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in STDLIB_SKIP_DIRS)
        files += [os.path.join(dirpath, n) for n in sorted(names) if n.endswith(".py")]
    files.sort()
    return files[:max_files] if max_files else files


def _is_validation_file(path: str, val_fraction: float) -> bool:
    # A hash of the relative path, so the split is the same on every machine and run.
    rel = os.path.relpath(path, sysconfig.get_paths()["stdlib"])
    return int(hashlib.md5(rel.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < val_fraction


def stdlib_texts(split: str | None, val_fraction: float, max_files: int | None = None) -> list[str]:
    """Texts of the train or validation files (``split=None``: all of them)."""
    texts = []
    for path in stdlib_files(max_files):
        if split is not None and _is_validation_file(path, val_fraction) != (split == "validation"):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        if text.strip():
            texts.append(text)
    return texts


def _load_source(source: dict[str, Any], split: str | None, val_fraction: float, seed: int):
    """One source as a ``datasets`` dataset with a ``text`` column.

    ``split`` "train" / "validation" holds out ``val_fraction`` of the documents (of the files,
    for the stdlib); ``None`` takes everything (for an explicit ``val_data``).
    """
    import datasets

    if not isinstance(source, dict):
        raise DataError(f"data source {source!r} must be a mapping such as {{path: corpus.jsonl}} or {{stdlib: {{}}}}")
    if "stdlib" in source:
        opts = source["stdlib"] or {}
        return datasets.Dataset.from_dict({"text": stdlib_texts(split, val_fraction, opts.get("max_files"))})
    field = source.get("text_field", "text")
    if "path" in source:
        files = sorted(glob.glob(os.path.expanduser(source["path"])))
        if not files:
            raise DataError(f"data path {source['path']!r} matches no file; check the path (globs are allowed)")
        ext = os.path.splitext(files[0])[1].lower()
        kind = {".jsonl": "json", ".json": "json", ".txt": "text", ".parquet": "parquet"}.get(ext)
        if kind is None:
            raise DataError(f"data file {files[0]} has an unsupported extension {ext!r}; use .jsonl, .txt or .parquet")
        kwargs = {"sample_by": "document"} if kind == "text" else {}
        ds = datasets.load_dataset(kind, data_files=files, split="train", **kwargs)
    elif "hub" in source:
        ds = datasets.load_dataset(
            source["hub"], source.get("config"), split=source.get("split", "train"),
            streaming=bool(source.get("streaming", False)),
        )
    else:
        raise DataError(f"data source {source!r} needs one of the keys stdlib, path, hub")
    if field not in (ds.column_names or [field]):
        raise DataError(f"data source {source!r} has no text field {field!r}; set text_field to one of {ds.column_names}")
    if field != "text":
        ds = ds.rename_column(field, "text")
    ds = ds.select_columns(["text"]) if ds.column_names else ds
    if split is not None:
        if source.get("streaming"):
            if split == "validation":
                raise DataError(f"streaming source {source.get('hub')!r} cannot hold out documents; set val_data explicitly")
        else:
            parts = ds.train_test_split(test_size=val_fraction, seed=seed, shuffle=True)
            ds = parts["test"] if split == "validation" else parts["train"]
    return ds


def load_texts(sources: Any, split: str | None, val_fraction: float, seed: int):
    """A source or a weighted list of sources as one dataset (mixtures via ``interleave_datasets``)."""
    import datasets

    sources = sources if isinstance(sources, list) else [sources]
    loaded = [_load_source(s, split, val_fraction, seed) for s in sources]
    if len(loaded) == 1:
        return loaded[0]
    weights = [float(s.get("weight", 1.0)) for s in sources]
    if min(weights) <= 0:
        raise DataError(f"data mixture weights {weights} must all be positive")
    probs = [w / sum(weights) for w in weights]
    return datasets.interleave_datasets(loaded, probabilities=probs, seed=seed, stopping_strategy="all_exhausted")


# ---- tokenizer -------------------------------------------------------------------------------
def train_bpe_tokenizer(texts, vocab_size: int):
    """A byte-level BPE tokenizer trained with ``tokenizers``, as an HF fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS_TOKEN], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN, pad_token=EOS_TOKEN)


def load_or_train_tokenizer(spec: Any, sources: Any, val_fraction: float, seed: int, cache_dir: str | None, fallback: str | None):
    """``spec``: an id/path, ``{"train_bpe": {"vocab_size": N}}``, or None (= ``fallback``, the model's)."""
    from transformers import AutoTokenizer

    if isinstance(spec, dict) and "train_bpe" in spec:
        vocab_size = int((spec["train_bpe"] or {}).get("vocab_size", 4096))
        key = hashlib.md5(json.dumps([sources, val_fraction, seed, vocab_size], sort_keys=True, default=str).encode()).hexdigest()[:16]
        path = os.path.join(cache_dir or "runs/cache", f"tokenizer-{key}")
        if not os.path.isdir(path):
            texts = load_texts(sources, "train", val_fraction, seed)
            tok = train_bpe_tokenizer((ex["text"] for ex in texts), vocab_size)
            tmp = f"{path}.{os.getpid()}.tmp"
            tok.save_pretrained(tmp)
            try:
                os.rename(tmp, path)
            except OSError:  # another process finished the same tokenizer first
                shutil.rmtree(tmp, ignore_errors=True)
        return AutoTokenizer.from_pretrained(path)
    name = spec if isinstance(spec, str) else fallback
    if name is None:
        raise DataError("no tokenizer: set tokenizer to an HF id / path or {train_bpe: {vocab_size: 4096}}")
    return AutoTokenizer.from_pretrained(name)


def tokenizer_fingerprint(tokenizer) -> str:
    return hashlib.md5(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()[:12]


# ---- packing ---------------------------------------------------------------------------------
def _eos_id(tokenizer) -> int:
    if tokenizer.eos_token_id is None:
        raise DataError("the tokenizer has no eos token; set one (tokenizer.eos_token) so documents can be separated")
    return int(tokenizer.eos_token_id)


def _tokenize(ds, tokenizer):
    eos = _eos_id(tokenizer)

    def encode(batch):
        ids = tokenizer(batch["text"], add_special_tokens=False)["input_ids"]
        return {"ids": [x + [eos] for x in ids]}

    return ds.map(encode, batched=True, remove_columns=["text"], desc="tokenizing")


def pack_tokens(ds, tokenizer, chunk_len: int) -> np.ndarray:
    """All documents, EOS-joined, cut into ``[N, chunk_len]`` (the remainder is dropped)."""
    tokenized = _tokenize(ds, tokenizer)
    flat = np.fromiter((t for ids in tokenized["ids"] for t in ids), dtype=np.int64)
    n = len(flat) // chunk_len
    if n == 0:
        raise DataError(f"the corpus has {len(flat)} tokens, fewer than one chunk of {chunk_len}; add data or lower seq_len")
    return flat[: n * chunk_len].reshape(n, chunk_len)


def _cache_key(sources: Any, split: str, val_fraction: float, seed: int, tokenizer, chunk_len: int) -> str:
    spec = json.dumps([sources, split, val_fraction, seed, tokenizer_fingerprint(tokenizer), chunk_len], sort_keys=True, default=str)
    return hashlib.md5(spec.encode()).hexdigest()[:16]


class PackedData:
    """Fixed chunks read in a seeded order; ``batch(position, count)`` is a pure function."""

    def __init__(self, chunks: np.ndarray, seed: int):
        self.chunks = torch.from_numpy(np.ascontiguousarray(chunks))
        self.seed = seed
        self._epoch, self._perm = -1, None

    def __len__(self) -> int:
        return self.chunks.shape[0]

    def _order(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._epoch, self._perm = epoch, torch.randperm(len(self), generator=g)
        return self._perm

    def batch(self, position: int, count: int) -> torch.Tensor:
        n = len(self)
        idx = []
        for i in range(position, position + count):
            idx.append(int(self._order(i // n)[i % n]))
        return self.chunks[idx]

    def sequential(self, count: int, start: int = 0) -> torch.Tensor:
        """Validation reads chunks in file order, the same every time."""
        return self.chunks[start : start + count]


class StreamingPackedData:
    """Packs a streaming (hub-scale) dataset on the fly; resuming skips the consumed chunks."""

    def __init__(self, ds, tokenizer, chunk_len: int, seed: int, shuffle_buffer: int = 10_000):
        self.ds = ds.shuffle(seed=seed, buffer_size=shuffle_buffer)
        self.tokenizer, self.chunk_len = tokenizer, chunk_len
        self._iter: Iterator[list[int]] | None = None
        self._pos = 0

    def _chunks(self) -> Iterator[list[int]]:
        eos = _eos_id(self.tokenizer)
        epoch, buf = 0, []
        while True:
            self.ds.set_epoch(epoch)
            for ex in self.ds:
                buf += self.tokenizer(ex["text"], add_special_tokens=False)["input_ids"] + [eos]
                while len(buf) >= self.chunk_len:
                    yield buf[: self.chunk_len]
                    buf = buf[self.chunk_len :]
            epoch += 1

    def batch(self, position: int, count: int) -> torch.Tensor:
        if self._iter is None or position != self._pos:
            self._iter, self._pos = self._chunks(), 0
            for _ in range(position):
                next(self._iter)
            self._pos = position
        out = [next(self._iter) for _ in range(count)]
        self._pos += count
        return torch.tensor(out, dtype=torch.long)


def build_packed(sources: Any, split: str, tokenizer, seq_len: int, val_fraction: float, seed: int, cache_dir: str | None):
    """Packed chunks of ``seq_len + 1`` tokens for ``split`` ("train" or "validation")."""
    sources_list = sources if isinstance(sources, list) else [sources]
    chunk_len = seq_len + 1
    if any(isinstance(s, dict) and s.get("streaming") for s in sources_list):
        return StreamingPackedData(load_texts(sources, split, val_fraction, seed), tokenizer, chunk_len, seed)
    path = None
    if cache_dir:
        key = _cache_key(sources, split, val_fraction, seed, tokenizer, chunk_len)
        path = os.path.join(cache_dir, f"packed-{split}-{key}.npy")
        if os.path.exists(path):
            return PackedData(np.load(path), seed)
    chunks = pack_tokens(load_texts(sources, split, val_fraction, seed), tokenizer, chunk_len)
    if path:
        os.makedirs(cache_dir, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp.npy"
        np.save(tmp, chunks)
        os.replace(tmp, path)
    return PackedData(chunks, seed)
