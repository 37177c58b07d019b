"""Config -> a run's training and validation data: the one place that picks the path.

* text sources, not streamed  -> a token store, prepared once (by ``prepare_data.py`` or on the
  fly, by the same writer) under ``cache_dir``, read by global sample index;
* ``{tokens: DIR}``           -> that store, read the same way;
* streamed text sources       -> training: this rank's stream packed in background workers;
  validation: the first ``eval_batches x micro_batch_size`` chunks of the held-out stream (``x
  global_batch_size`` under ``micro_batch_size: auto``), written once to a token store, so every
  evaluation scores the same sequences.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from rpt.data.packed import PackedStore, StoreBatches
from rpt.data.rank_stream import PackedStream, StreamBatches
from rpt.data.sources import (
    as_list,
    check_sources,
    content_fingerprint,
    describe,
    documents,
    is_streaming,
    is_token_store,
)
from rpt.data.token_store import INDEX, TokenStore, read_index, write_token_store
from rpt.data.tokenizer import bos_id, load_or_train_tokenizer, load_tokenizer, tokenizer_fingerprint
from rpt.errors import DataError

SPLITS = ("train", "validation")


def split_sources(cfg, split: str) -> tuple[Any, str | None]:
    """The sources of ``split`` and which side of the held-out split to keep (None: all)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if cfg.val_data is None:
        return cfg.data, split
    return (cfg.data, None) if split == "train" else (cfg.val_data, None)


def validation_chunks(cfg) -> int:
    """How many chunks one evaluation reads."""
    return cfg.eval_batches * cfg.eval_batch_rows()


def _key(*parts: Any) -> str:
    return hashlib.md5(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def store_identity(cfg, split: str, tokenizer, max_tokens: int | None = None) -> dict[str, str]:
    """What the store of a text split is built from: ``recipe`` (the sources as configured, the
    held-out split, the tokenizer, the cut) and ``content`` (:func:`content_fingerprint` of the
    files); recorded in the store's index, so a store is only ever reused for the same two."""
    sources, holdout = split_sources(cfg, split)
    mixture_seed = cfg.seed if len(as_list(sources)) > 1 else None  # interleaving draws from the seed
    parts = ["store-v2", describe(sources), holdout, cfg.val_fraction if holdout else None, mixture_seed,
             tokenizer_fingerprint(tokenizer), max_tokens]
    if bos_id(tokenizer) is not None:  # stores of BOS-prepending tokenizers now hold BOS: not the old ones
        parts.append(("bos", bos_id(tokenizer)))
    return {"recipe": _key(*parts), "content": content_fingerprint(sources)}


def default_store_path(cfg, split: str, tokenizer, max_tokens: int | None = None) -> str:
    """Where training looks for (and writes) the store of a text split: keyed by what shapes it and
    by the content of its files (a corpus rewritten in place is prepared again)."""
    identity = store_identity(cfg, split, tokenizer, max_tokens)
    return os.path.join(cfg.cache_dir, f"tokens-{split}-{identity['recipe']}-{identity['content']}")


def _store_dir(sources: Any, split: str, holdout: str | None) -> str:
    root = os.path.expanduser(str(as_list(sources)[0]["tokens"]))
    if os.path.isfile(os.path.join(root, INDEX)):
        if holdout == "validation":
            raise DataError(f"token store {root} holds no held-out documents; set val_data: {{tokens: DIR}} "
                            "(prepare_data.py --out writes DIR/train and DIR/validation) or eval_batches: 0")
        return root
    sub = os.path.join(root, split)
    if os.path.isfile(os.path.join(sub, INDEX)):
        return sub
    raise DataError(f"{root} is not a token store (no {INDEX} in it or in {split}/); "
                    "write one with `python prepare_data.py --config X.yaml --out DIR`")


def build_tokenizer(cfg):
    """The run's tokenizer: ``cfg.tokenizer`` (an id/path, or trained on the training text), the
    model's, or -- training from a token store without a named one -- the store's own."""
    sources, holdout = split_sources(cfg, "train")
    if is_token_store(sources) and not isinstance(cfg.tokenizer, str):
        store = _store_dir(sources, "train", holdout)
        if not os.path.isfile(os.path.join(store, "tokenizer", "tokenizer.json")):
            raise DataError(f"token store {store} has no tokenizer/tokenizer.json (the tokenizer that wrote it); set "
                            "config key 'tokenizer' to that tokenizer, or prepare the store again")
        return load_tokenizer(os.path.join(store, "tokenizer"))
    return load_or_train_tokenizer(
        cfg.tokenizer, cfg.data, cfg.val_fraction, cfg.seed, cfg.cache_dir,
        fallback=cfg.init_from or (cfg.model if isinstance(cfg.model, str) else None), holdout=holdout,
    )


def prepare_store(cfg, split: str, tokenizer, path: str | None = None, *, num_proc: int | None = None,
                  max_tokens: int | None = None, progress: bool = True, log=print) -> str:
    """Write the token store of a text split unless it exists; returns its path.

    The one writer behind ``prepare_data.py`` and the on-the-fly preparation of small corpora.
    """
    sources, holdout = split_sources(cfg, split)
    check_sources(sources, "data" if sources is cfg.data else "val_data")
    if is_token_store(sources):
        return _store_dir(sources, split, holdout)
    identity = store_identity(cfg, split, tokenizer, max_tokens)
    named = path is not None  # prepare_data.py --out: a directory the user chose, perhaps used before
    path = path or default_store_path(cfg, split, tokenizer, max_tokens)
    if os.path.lexists(path) and not (os.path.isdir(path) and not os.listdir(path)):
        _check_reusable(path, identity, named)
        if progress:
            log(f"{split}: {path} already holds this data's token store; kept")
        return path
    if not named:
        _note_changed_corpus(path, split, log)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    meta = {"source": describe(sources), "split": split, "holdout": holdout,
            "val_fraction": cfg.val_fraction if holdout else None, "max_tokens": max_tokens, "identity": identity}
    index = write_token_store(
        path, documents(sources, holdout, cfg.val_fraction, cfg.seed), tokenizer,
        num_proc=num_proc or cfg.tokenize_workers, max_tokens=max_tokens, meta=meta, progress=progress, desc=f"tokenizing {split}",
    )
    log(f"prepared {split}: {index['num_tokens']:,} tokens in {index['num_documents']:,} documents, "
        f"{index['tokens_per_s']:,.0f} tokens/s with {index['num_proc']} process(es) -> {path}")
    return path


def _check_reusable(path: str, identity: dict[str, str], named: bool) -> None:
    """An existing store at ``path`` is reused only if it was built from the same recipe and content."""
    if not os.path.isfile(os.path.join(path, INDEX)):
        raise DataError(f"{path} exists and is not a token store (no {INDEX}); choose another --out or remove it")
    index = read_index(path)
    recorded = index.get("identity")
    if recorded == identity:
        return
    source = index.get("source", "?")
    what = ("was written before stores recorded what they were built from" if recorded is None else
            "was built from other data or settings" + (" (the same sources, whose files have changed since)"
                                                       if recorded.get("recipe") == identity["recipe"] else "")
            if isinstance(recorded, dict) else "records something else as its origin")
    fix = "choose another --out, or delete it to prepare it there again" if named else "delete it to prepare it again"
    raise DataError(f"the token store {path} {what} (its source: {str(source)[:120]}); it is not reused for this "
                    f"data: {fix}")


def _note_changed_corpus(path: str, split: str, log) -> None:
    """Say so when the cache holds this split's store for the same recipe over other file content."""
    recipe_prefix = os.path.basename(path).rsplit("-", 1)[0] + "-"
    directory = os.path.dirname(path)
    old = sorted(n for n in (os.listdir(directory) if os.path.isdir(directory) else [])
                 if n.startswith(recipe_prefix) and os.path.isfile(os.path.join(directory, n, INDEX)))
    if old:
        log(f"note: the {split} data's files changed (size or modification time) since its token store "
            f"{os.path.join(directory, old[-1])} was prepared; preparing it again (the old store can be deleted)")


def open_store(cfg, split: str, tokenizer) -> TokenStore:
    """The token store of ``split``, preparing it first when it is text (see the module doc)."""
    sources, holdout = split_sources(cfg, split)
    if is_token_store(sources):
        store = TokenStore(_store_dir(sources, split, holdout))
        store.check_tokenizer(tokenizer)
        return store
    max_tokens = None
    if is_streaming(sources):  # a fixed validation set: the first chunks of the stream, once
        max_tokens = validation_chunks(cfg) * (cfg.seq_len + 1)
    return TokenStore(prepare_store(cfg, split, tokenizer, max_tokens=max_tokens, progress=False))


def _stream_batches(cfg, tokenizer, rank: int, world_size: int, micro_batch_size: int):
    sources, holdout = split_sources(cfg, "train")
    docs = documents(sources, holdout, cfg.val_fraction, cfg.seed)
    # The whole stream: PackedStream splits it by (rank, worker) and shuffles it itself, so that
    # the order is a function of (seed, epoch, position) and resumes exactly (rpt.data.rank_stream).
    stream = PackedStream(docs, tokenizer, cfg.seq_len + 1, seed=cfg.seed, shuffle_buffer=cfg.shuffle_buffer,
                          rank=rank, world_size=world_size)
    return StreamBatches(stream, micro_batch_size, cfg.data_workers, rank)


def build_packed(cfg, split: str, tokenizer, rank: int = 0, world_size: int = 1, micro_batch_size: int | None = None,
                 global_batch: int | None = None):
    """``split`` "validation": a :class:`PackedStore` (read with ``sequential``). ``split``
    "train": a source of micro-batches, ``micro_batch(step, micro)`` plus ``state_dict`` /
    ``load_state_dict`` -- :class:`StoreBatches` or, for streamed text, ``StreamBatches``, read in
    micro-batches of ``micro_batch_size`` with ``global_batch`` sequences per step (the run's split,
    ``rpt.training.micro_batch``; None: the config's ``micro_batch_size`` and ``global_batch``)."""
    micro_batch_size = cfg.micro_batch_size if micro_batch_size is None else micro_batch_size
    sources, _ = split_sources(cfg, split)
    check_sources(sources, "data" if split == "train" or cfg.val_data is None else "val_data")
    if split == "train" and is_streaming(sources) and not is_token_store(sources):
        return _stream_batches(cfg, tokenizer, rank, world_size, micro_batch_size)
    packed = PackedStore(open_store(cfg, split, tokenizer), cfg.seq_len + 1, cfg.seed)
    if split == "validation":
        return packed
    return StoreBatches(packed, micro_batch_size, cfg.global_batch(world_size) if global_batch is None else global_batch)


def check_vocabulary(vocab: int, *datasets) -> None:
    """Before the first step, every token store training reads records its largest id below ``vocab``
    (the model's embedding rows), and every batch read later is checked against it (a store written
    before stores recorded the id, a shard edited since, a tokenizer numbering past the model's rows in
    streamed data): a :class:`DataError` names the store (or stream), the id and the vocabulary."""
    for data in datasets:
        packed = data.packed if isinstance(data, StoreBatches) else data
        if isinstance(packed, (PackedStore, StreamBatches)):
            packed.limit_vocabulary(vocab)
