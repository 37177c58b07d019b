"""Data sources -> documents: a ``datasets.IterableDataset`` with one ``text`` column.

Sources (a single mapping or a list, each optionally with ``weight`` for a mixture):

* ``{"stdlib": {"max_files": N}}`` -- the Python standard library of the running interpreter.
* ``{"path": "corpus.jsonl" | "*.txt" | "*.parquet", "text_field": "text", "streaming": bool}``.
* ``{"hub": "name", "config": C, "split": "train", "text_field": "text", "streaming": bool}``.
* ``{"tokens": DIR}`` -- an already tokenised store (:mod:`rpt.data.token_store`); no text.

Every text source is read the same way, as a stream of documents cut into *shards* (a byte
range of a JSONL file, a row group of a parquet file, one text file, one stdlib file, or a hub
dataset's own files): the token-store writer, the streaming trainer and the tokenizer trainer
all consume it, ``datasets`` splits the shards across ranks and DataLoader workers, and its
``state_dict`` resumes a stream by re-reading at most one shard (never the data before it).

**Held-out documents.** Without an explicit ``val_data``, a document is validation data when
a hash of its text falls below ``val_fraction`` (for the stdlib: a hash of its file path).
The decision is a function of the document alone, so it is the same in every process, on every
machine, streamed or not, and a document -- or an exact copy of it -- can never be on both sides.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import sys
import sysconfig
from typing import Any

from rpt.errors import DataError

STDLIB_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "lib2to3"}
SOURCE_KINDS = ("stdlib", "path", "hub", "tokens")
LOCAL_KINDS = {".jsonl": "jsonl", ".json": "jsonl", ".txt": "text", ".parquet": "parquet"}
SHARD_BYTES = 8 << 20  # JSONL byte ranges: the most a resumed stream re-reads


# ---- the source specification ------------------------------------------------------------------
def as_list(sources: Any) -> list:
    return sources if isinstance(sources, list) else [sources]


def check_sources(sources: Any, key: str = "data") -> list[dict[str, Any]]:
    """The sources as a list of mappings, or a :class:`DataError` naming the problem."""
    items = as_list(sources)
    if not items:
        raise DataError(f"config key {key!r} is an empty list; give at least one source such as {{path: corpus.jsonl}}")
    for s in items:
        if not isinstance(s, dict):
            raise DataError(f"{key} source {s!r} must be a mapping such as {{path: corpus.jsonl}} or {{stdlib: {{}}}}")
        kinds = [k for k in SOURCE_KINDS if k in s]
        if len(kinds) != 1:
            raise DataError(f"{key} source {s!r} needs exactly one of the keys {', '.join(SOURCE_KINDS)}")
        if "weight" in s and not float(s["weight"]) > 0:
            raise DataError(f"{key} source {s!r} has weight {s['weight']!r}; mixture weights must be positive")
    if len(items) > 1 and any("tokens" in s for s in items):
        raise DataError(f"{key}: a token store ({{tokens: DIR}}) must be the only source; mix texts before preparing it")
    return items


def is_token_store(sources: Any) -> bool:
    return any(isinstance(s, dict) and "tokens" in s for s in as_list(sources))


def is_streaming(sources: Any) -> bool:
    return any(isinstance(s, dict) and s.get("streaming") for s in as_list(sources))


def describe(sources: Any) -> str:
    return json.dumps(sources, sort_keys=True, default=str)


def _file_stamps(files: list[str], root: str | None = None) -> list[tuple[str, int, int]]:
    stamps = []
    for path in files:
        st = os.stat(path)
        stamps.append((os.path.relpath(path, root) if root else os.path.abspath(path), st.st_size, st.st_mtime_ns))
    return stamps


@functools.lru_cache(maxsize=64)
def hub_dataset_commit(name: str, revision: str | None) -> str | None:
    """The commit a hub dataset source reads: asked of the hub once per process when online, else the
    commit the local hub cache holds for ``revision`` (default ``main``); None when neither says."""
    if revision and len(revision) == 40 and all(c in "0123456789abcdef" for c in revision):
        return revision  # pinned to a commit
    from huggingface_hub import constants

    from rpt.checkpoint.model_ref import hub_offline  # late: huggingface_hub, only for hub sources

    if not hub_offline():
        try:
            from huggingface_hub import HfApi

            return HfApi().dataset_info(name, revision=revision, timeout=10).sha
        except Exception:  # unreachable, or not a hub repo (a local datasets script): the cache's word below
            pass
    ref = os.path.join(constants.HF_HUB_CACHE, f"datasets--{name.replace('/', '--')}", "refs", revision or "main")
    try:
        with open(ref, encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


def content_fingerprint(sources: Any) -> str:
    """What the texts of ``sources`` are read from, as a short hash: each local file's path, size and
    modification time (the stdlib's files with the interpreter's version), a hub source's commit.
    One ``stat`` per file: a corpus rewritten in place gets another fingerprint, so whatever was
    built from it (a cached token store, a trained tokenizer) is built again instead of reused."""
    parts: list[Any] = []
    for s in as_list(sources):
        if not isinstance(s, dict):
            parts.append(None)
        elif "path" in s:
            parts.append(_file_stamps(sorted(glob.glob(os.path.expanduser(str(s["path"]))))))
        elif "stdlib" in s:
            root = sysconfig.get_paths()["stdlib"]
            parts.append([sys.version, _file_stamps(stdlib_files((s["stdlib"] or {}).get("max_files")), root)])
        elif "hub" in s:
            parts.append([s["hub"], s.get("revision"), hub_dataset_commit(str(s["hub"]), s.get("revision"))])
        else:
            parts.append(None)
    return hashlib.md5(json.dumps(parts, default=str).encode()).hexdigest()[:12]


# ---- held-out documents --------------------------------------------------------------------------
def _fraction_of(key: str) -> float:
    return int(hashlib.md5(key.encode("utf-8", "replace")).hexdigest()[:8], 16) / 0xFFFFFFFF


def is_validation_text(text: str, val_fraction: float) -> bool:
    return _fraction_of(text) < val_fraction


def _keep(example: dict, val_fraction: float, validation: bool) -> bool:
    return is_validation_text(example["text"], val_fraction) == validation


# ---- the standard library ------------------------------------------------------------------------
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
    return _fraction_of(os.path.relpath(path, sysconfig.get_paths()["stdlib"])) < val_fraction


def _stdlib_split(split: str | None, val_fraction: float, max_files: int | None) -> list[str]:
    files = stdlib_files(max_files)
    if split is None:
        return files
    return [p for p in files if _is_validation_file(p, val_fraction) == (split == "validation")]


def _read_text_file(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def stdlib_texts(split: str | None, val_fraction: float, max_files: int | None = None) -> list[str]:
    """Texts of the train or validation files (``split=None``: all of them)."""
    texts = (_read_text_file(p) for p in _stdlib_split(split, val_fraction, max_files))
    return [t for t in texts if t.strip()]


def _read_user_text_file(path: str) -> str:
    """A text source's file: UTF-8, or one error naming it (no silent replacement characters)."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise DataError(f"{path} line {line} is not UTF-8 text (byte {data[e.start]:#04x}); text sources are read as "
                        "UTF-8: convert the file (e.g. iconv -f latin1 -t utf-8) or leave it out") from None


def _gen_text_files(files: list[str], strict: bool = False):
    for path in files:
        text = _read_user_text_file(path) if strict else _read_text_file(path)
        if text.strip():
            yield {"text": text}


# ---- local files, cut into shards ------------------------------------------------------------------
def _local_files(source: dict) -> tuple[str, list[str]]:
    files = sorted(glob.glob(os.path.expanduser(source["path"])))
    if not files:
        raise DataError(f"data path {source['path']!r} matches no file; check the path (globs are allowed)")
    exts = {os.path.splitext(f)[1].lower() for f in files}
    kinds = {LOCAL_KINDS.get(e) for e in exts}
    if None in kinds or len(kinds) > 1:
        raise DataError(f"data path {source['path']!r} matches files with extensions {sorted(exts)}; "
                        "use one kind of .jsonl, .txt or .parquet")
    return kinds.pop(), files


def jsonl_shards(files: list[str], shard_bytes: int | None = None) -> list[tuple[str, int, int]]:
    """``(file, start, end)`` byte ranges; a range owns the lines that *start* inside it."""
    shard_bytes = shard_bytes or SHARD_BYTES
    shards = []
    for path in files:
        size = os.path.getsize(path)
        shards += [(path, a, min(a + shard_bytes, size)) for a in range(0, max(size, 1), shard_bytes)]
    return shards


def _line_number(path: str, offset: int) -> int:
    """The 1-based number of the line starting at byte ``offset`` (an error path: one read up to it)."""
    count = 0
    with open(path, "rb") as f:
        while offset > 0:
            block = f.read(min(offset, 1 << 20))
            if not block:
                break
            count, offset = count + block.count(b"\n"), offset - len(block)
    return count + 1


def _jsonl_text(path: str, at: int, line: bytes, field: str) -> str | None:
    """The text of one JSONL line (None: the field is null); a :class:`DataError` naming the file and
    line for bytes that are not UTF-8, a line that is not JSON, or a text that is not a string."""
    try:
        record = json.loads(line)
    except UnicodeDecodeError:
        raise DataError(f"{path} line {_line_number(path, at)} is not UTF-8 text; a JSON Lines file is UTF-8 text, one "
                        "object per line (is it a binary file?)") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{path} line {_line_number(path, at)} is not valid JSON ({e}); the file must be JSON Lines, "
                        "one object per line") from None
    text = record.get(field) if isinstance(record, dict) else None
    if text is None:
        if not isinstance(record, dict) or field not in record:
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise DataError(f"{path} line {_line_number(path, at)}: a record has no text field {field!r}; set "
                            f"text_field to one of {keys}")
        return None
    if not isinstance(text, str):
        kind = {dict: "an object", list: "a list", bool: "a boolean"}.get(type(text), "a number")
        raise DataError(f"{path} line {_line_number(path, at)}: the text field {field!r} is {kind} "
                        f"({json.dumps(text)[:60]}), not a string; set text_field to the field that holds the text")
    if b"\\ud" in line.lower():  # an escaped lone surrogate decodes to a str no tokenizer can encode
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise DataError(f"{path} line {_line_number(path, at)}: the text field {field!r} holds an unpaired "
                            "surrogate escape (\\ud800-\\udfff), which is not text; fix the line") from None
    return text


def _gen_jsonl(shards: list[tuple[str, int, int]], field: str):
    for path, start, end in shards:
        with open(path, "rb") as f:
            if start > 0:
                f.seek(start - 1)
                f.readline()  # the line holding byte start-1 belongs to the previous range
            while f.tell() < end:
                at = f.tell()
                line = f.readline()
                if not line:
                    break
                if not line.strip():
                    continue
                text = _jsonl_text(path, at, line, field)
                if text is not None:
                    yield {"text": text}


def parquet_shards(files: list[str]) -> list[tuple[str, int]]:
    import pyarrow.parquet as pq

    return [(path, g) for path in files for g in range(pq.ParquetFile(path).metadata.num_row_groups)]


def _gen_parquet(shards: list[tuple[str, int]], field: str):
    import pyarrow as pa
    import pyarrow.parquet as pq

    for path, group in shards:
        pf = pq.ParquetFile(path)
        if field not in pf.schema_arrow.names:
            raise DataError(f"{path} has no text field {field!r}; set text_field to one of {pf.schema_arrow.names}")
        kind = pf.schema_arrow.field(field).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise DataError(f"{path}: the text field {field!r} is a column of {kind}, not of strings; set text_field to "
                            "the column that holds the text")
        for text in pf.read_row_group(group, columns=[field]).column(0).to_pylist():
            if text is not None:
                yield {"text": str(text)}


def _first_record_check(kind: str, files: list[str], field: str) -> None:
    """Fail before any work when the first file lacks the text field."""
    if kind == "jsonl":
        next(_gen_jsonl(jsonl_shards(files[:1]), field), None)
    elif kind == "parquet":
        next(_gen_parquet(parquet_shards(files[:1])[:1], field), None)


def _from_generator(fn, **gen_kwargs):
    import datasets

    features = datasets.Features({"text": datasets.Value("string")})
    return datasets.IterableDataset.from_generator(fn, features=features, gen_kwargs=gen_kwargs)


# ---- one source, all sources -----------------------------------------------------------------------
def source_documents(source: dict[str, Any], holdout: str | None, val_fraction: float):
    """One text source as an ``IterableDataset`` of ``{"text": str}``.

    ``holdout`` "train" / "validation" keeps the documents on that side of the held-out split;
    ``None`` keeps everything (for an explicit ``val_data``).
    """
    import datasets

    field = source.get("text_field", "text")
    hashed_split = holdout is not None
    if "stdlib" in source:
        files = _stdlib_split(holdout, val_fraction, (source["stdlib"] or {}).get("max_files"))
        ds, hashed_split = _from_generator(_gen_text_files, files=files), False  # split by file path
    elif "path" in source:
        kind, files = _local_files(source)
        _first_record_check(kind, files, field)
        if kind == "jsonl":
            ds = _from_generator(_gen_jsonl, shards=jsonl_shards(files), field=field)
        elif kind == "parquet":
            ds = _from_generator(_gen_parquet, shards=parquet_shards(files), field=field)
        else:
            ds = _from_generator(_gen_text_files, files=files, strict=True)
    elif "hub" in source:
        kwargs = {k: source[k] for k in ("revision", "data_dir", "data_files") if k in source}
        if source.get("streaming"):
            ds = datasets.load_dataset(source["hub"], source.get("config"), split=source.get("split", "train"), streaming=True, **kwargs)
            if hasattr(ds, "reshard"):
                ds = ds.reshard()  # parquet row groups as shards: finer rank split, shorter resume
        else:
            table = datasets.load_dataset(source["hub"], source.get("config"), split=source.get("split", "train"), **kwargs)
            ds = table.to_iterable_dataset(num_shards=max(1, min(len(table), 256)))
        names = list(ds.column_names or [])
        if names and field not in names:
            raise DataError(f"data source {source!r} has no text field {field!r}; set text_field to one of {names}")
        kind = (ds.features or {}).get(field)
        if kind is not None and getattr(kind, "dtype", None) not in ("string", "large_string"):
            raise DataError(f"data source {source!r}: the text field {field!r} holds {kind}, not strings; set text_field "
                            "to the column that holds the text")
        if field != "text":
            ds = ds.rename_column(field, "text")
        ds = ds.select_columns(["text"])
    elif "tokens" in source:
        raise DataError(f"{source!r} is a token store, not text; it is read directly (rpt.data.run_data)")
    else:
        raise DataError(f"data source {source!r} needs one of the keys {', '.join(SOURCE_KINDS)}")
    if hashed_split:
        ds = ds.filter(functools.partial(_keep, val_fraction=val_fraction, validation=holdout == "validation"))
    return ds


def documents(sources: Any, holdout: str | None, val_fraction: float, seed: int):
    """A source or a weighted list of sources as one stream (mixtures: ``interleave_datasets``)."""
    import datasets

    items = check_sources(sources)
    streams = [source_documents(s, holdout, val_fraction) for s in items]
    if len(streams) == 1:
        return streams[0]
    weights = [float(s.get("weight", 1.0)) for s in items]
    probs = [w / sum(weights) for w in weights]
    return datasets.interleave_datasets(streams, probabilities=probs, seed=seed, stopping_strategy="all_exhausted")


def texts(sources: Any, holdout: str | None, val_fraction: float, seed: int):
    """The documents' texts, in stream order."""
    return (ex["text"] for ex in documents(sources, holdout, val_fraction, seed))
