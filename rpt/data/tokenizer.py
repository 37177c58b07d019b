"""Tokenizers: load or train one, and the one statement of how documents become tokens."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable
from typing import Any

import numpy as np

from rpt.data.sources import content_fingerprint, is_token_store, texts
from rpt.errors import DataError

EOS_TOKEN = "<|endoftext|>"


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int):
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


def load_or_train_tokenizer(spec: Any, sources: Any, val_fraction: float, seed: int, cache_dir: str | None,
                            fallback: str | None, holdout: str | None = "train"):
    """``spec``: an id/path, ``{"train_bpe": {"vocab_size": N}}``, or None (= ``fallback``, the model's).

    A trained tokenizer sees only the ``holdout`` side of the held-out split (None: all of
    ``sources``, when validation data is given separately) and is cached under ``cache_dir``.
    """
    if isinstance(spec, dict) and "train_bpe" in spec:
        if is_token_store(sources):
            raise DataError("tokenizer {train_bpe: ...} needs text data, but data is a token store; "
                            "set tokenizer to the store's tokenizer (see its index.json)")
        vocab_size = int((spec["train_bpe"] or {}).get("vocab_size", 4096))
        # Keyed by the files' content too (size, mtime): a corpus rewritten in place trains a new tokenizer.
        key = hashlib.md5(json.dumps(["v2", sources, holdout, val_fraction, seed, vocab_size, content_fingerprint(sources)],
                                     sort_keys=True, default=str).encode()).hexdigest()[:16]
        path = os.path.join(cache_dir or "runs/cache", f"tokenizer-{key}")
        if not os.path.isdir(path):
            tok = train_bpe_tokenizer(texts(sources, holdout, val_fraction, seed), vocab_size)
            tmp = f"{path}.{os.getpid()}.tmp"  # a directory (not write_atomic's file); the first rename wins
            tok.save_pretrained(tmp)
            try:
                os.rename(tmp, path)
            except OSError:  # another process finished the same tokenizer first
                shutil.rmtree(tmp, ignore_errors=True)
        return load_tokenizer(path)
    name = spec if isinstance(spec, str) else fallback
    if name is None:
        raise DataError("no tokenizer: set tokenizer to an HF id / path or {train_bpe: {vocab_size: 4096}}")
    return load_tokenizer(name)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt")


def _damaged_file(directory: str) -> str | None:
    """Which of a tokenizer directory's files is not UTF-8 (or not JSON), if one is."""
    for name in TOKENIZER_FILES:
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            return f"{path} is not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start})"
        if name.endswith(".json"):
            try:
                json.loads(text)
            except json.JSONDecodeError as e:
                return f"{path} is not valid JSON ({e})"
    return None


def load_tokenizer(name: str):
    """``AutoTokenizer.from_pretrained(name)``; a tokenizer that cannot be loaded is one :class:`DataError`
    naming the file at fault where a local one is (transformers' own message names none: "'utf-8' codec
    can't decode byte 0xff"; the Rust side raises a bare ``Exception``)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except Exception as e:
        local = os.path.expanduser(str(name))
        found = _damaged_file(local) if os.path.isdir(local) else None
        detail = found or " ".join(str(e).split())[:300] or type(e).__name__
        raise DataError(f"cannot load a tokenizer from {name}: {detail}; give a tokenizer directory that "
                        "save_pretrained wrote, or set config key 'tokenizer'") from None


def backend_of(tokenizer):
    """The Rust ``tokenizers.Tokenizer`` behind an HF fast tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise DataError(f"tokenizer {type(tokenizer).__name__} is not a fast tokenizer; use one with a tokenizer.json")
    return backend


def tokenizer_fingerprint(tokenizer) -> str:
    return hashlib.md5(backend_of(tokenizer).to_str().encode()).hexdigest()[:12]


def eos_id(tokenizer) -> int:
    if tokenizer.eos_token_id is None:
        raise DataError("the tokenizer has no eos token; set one (tokenizer.eos_token) so documents can be separated")
    return int(tokenizer.eos_token_id)


def bos_id(tokenizer) -> int | None:
    """The BOS id the tokenizer itself puts before a text (``tokenizer(text)``, as ``sample.py``
    prompts get it: Llama-3-style post-processors), else None (GPT-2 style, the trained BPE)."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return None
    ids = tokenizer("x")["input_ids"]  # add_special_tokens=True: what a prompt gets
    return int(bos) if ids and ids[0] == bos else None


def encode_documents(backend, texts: list[str], eos: int, dtype=np.int64, bos: int | None = None) -> np.ndarray:
    """The documents' tokens, each document followed by EOS (and preceded by ``bos`` when the
    tokenizer prepends one: :func:`bos_id`), as one flat array.

    The single definition of tokenisation: the token-store writer (in any number of processes)
    and the streaming packer both call it, so a store and a stream of the same documents hold
    the same tokens. The text itself is encoded with ``add_special_tokens=False`` and the
    specials are placed here, so a document is ``[BOS] text EOS`` exactly once each.
    """
    # encode_batch_fast (tokenizers >= 0.21) skips the character offsets we do not use.
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    encodings = encode(texts, add_special_tokens=False)
    lead = 0 if bos is None else 1
    out = np.empty(sum(lead + len(e.ids) + 1 for e in encodings), dtype=dtype)
    at = 0
    for e in encodings:
        if bos is not None:
            out[at] = bos
        n = len(e.ids)
        out[at + lead : at + lead + n] = e.ids
        out[at + lead + n] = eos
        at += lead + n + 1
    return out
