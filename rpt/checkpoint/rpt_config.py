"""The one reader of an RPT checkpoint's ``rpt_config.json`` and offset table, and the one check
that a checkpoint may be decoded with RPT (its trained window covers the requested one, and it
was trained with the RPT objective).

Every entry point (``RPTForCausalLM.from_pretrained`` / ``attach_table``, ``sample.py`` and the
evaluation scripts, ``custom_generate``, LoRA loading, training's ``init_from``) reads the files
through here, so a bad file fails the same way everywhere: one error naming the file, the key and
the fix, raised before anything is allocated (a window is bounded by :data:`MAX_WINDOW`, the
table's shape is read from the safetensors header before its data).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from rpt.checkpoint.directories import CheckpointError
from rpt.checkpoint.folded_weights import FORMAT_FOLDED, FORMAT_UNFOLDED

RPT_CONFIG_NAME = "rpt_config.json"
# Not a top-level *.safetensors: weight loaders that glob the directory would read it as model weights.
RPT_TABLE_NAME = "rpt_table/offset_embedding.safetensors"
LEGACY_TABLE_NAME = "rpt_offset_embedding.safetensors"  # where checkpoints before the subfolder kept it
TABLE_KEY = "offset_embedding.weight"
TIED_TABLE_KEY = "offset_embedding.tied_absolute"  # the absolute table of a model saved untied from tied
OBJECTIVES = ("rpt", "ntp")
# Far above any useful window (the paper uses 3); bounds the table allocated from a damaged file.
MAX_WINDOW = 4096
_FIX = "re-save the checkpoint (RPTForCausalLM.save_pretrained) or restore the file from the run"


def offset_rows(window: int) -> list[str]:
    """The offset table's rows as ``rpt_config.json`` names them: ``+1`` (NTP), ``-1..-(w-1)``, ``+w``."""
    return ["+1"] + [f"-{l}" for l in range(1, window)] + [f"+{window}"]


@dataclass(frozen=True)
class RPTConfig:
    """A checked ``rpt_config.json``."""

    path: str  # the file it was read from
    window: int
    format_version: int = FORMAT_UNFOLDED
    untied_embeddings: bool = False
    objective: str | None = None  # None: written before checkpoints recorded their objective
    lora: dict[str, Any] | None = None  # an adapter directory (rpt.model.lora)
    raw: dict[str, Any] = field(default_factory=dict, compare=False)


def _bad(path: str, key: str, value: Any, rule: str) -> CheckpointError:
    return CheckpointError(f"{path} key {key!r} = {value!r} is invalid: {rule}; {_FIX}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_rpt_config(raw: Any, path: str) -> RPTConfig:
    """Check the parsed JSON of ``path``: types, ranges and the keys the code reads."""
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path} must hold a JSON object with a 'window' key, not a {type(raw).__name__}; {_FIX}")
    if "window" not in raw:
        raise CheckpointError(f"{path} has no 'window' key (the trained window, an integer >= 2); {_FIX}")
    window = raw["window"]
    if not _is_int(window) or not 2 <= window <= MAX_WINDOW:
        raise _bad(path, "window", window, f"the trained window is an integer in [2, {MAX_WINDOW}]")
    version = raw.get("format_version", FORMAT_UNFOLDED)
    if not _is_int(version) or version < FORMAT_UNFOLDED:
        raise _bad(path, "format_version", version, f"use {FORMAT_UNFOLDED} or {FORMAT_FOLDED}")
    if version > FORMAT_FOLDED:
        raise CheckpointError(f"{path} has RPT checkpoint format version {version}; this rpt reads versions "
                              f"{FORMAT_UNFOLDED} and {FORMAT_FOLDED}: upgrade rpt")
    for key in ("ntp_row_folded", "untied_embeddings"):
        if key in raw and not isinstance(raw[key], bool):
            raise _bad(path, key, raw[key], "use true or false")
    if "offset_rows" in raw and raw["offset_rows"] != offset_rows(window):
        raise _bad(path, "offset_rows", raw["offset_rows"], f"a window of {window} has rows {offset_rows(window)}")
    _check_records(raw, path)
    return RPTConfig(path, window, version, bool(raw.get("untied_embeddings", False)), raw.get("objective"),
                     raw.get("lora"), raw)


def _check_records(raw: dict[str, Any], path: str) -> None:
    """The training objective and the LoRA adapter's record."""
    objective = raw.get("objective")
    if objective is not None and objective not in OBJECTIVES:
        raise _bad(path, "objective", objective, f"use one of {', '.join(OBJECTIVES)}")
    lora = raw.get("lora")
    if lora is not None and not (isinstance(lora, dict) and isinstance(lora.get("base"), str) and lora["base"]):
        raise _bad(path, "lora", lora, "an adapter's record is a mapping with 'base' (its base model's path or id)")
    fingerprint = (lora or {}).get("base_fingerprint")
    if fingerprint is not None and not (isinstance(fingerprint, dict) and all(map(_is_tensor_print, fingerprint.values()))):
        raise _bad(path, "lora.base_fingerprint", "...", "per tensor name a mapping of shape, sample and abs_mean")


def _is_tensor_print(entry: Any) -> bool:
    number = (int, float)
    return (isinstance(entry, dict) and isinstance(entry.get("shape"), list) and all(_is_int(d) for d in entry["shape"])
            and isinstance(entry.get("sample"), list) and all(isinstance(v, number) for v in entry["sample"])
            and isinstance(entry.get("abs_mean"), number))


def load_rpt_config_file(path: str) -> RPTConfig:
    """Read and check the ``rpt_config.json`` at ``path``."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({e}); {_FIX}") from None
    return parse_rpt_config(raw, path)


def rpt_config_file(path_or_id: str | os.PathLike, **lookup) -> str | None:
    """The local ``rpt_config.json`` of a checkpoint directory or hub repo; None for a plain causal LM."""
    from transformers.utils import cached_file

    return cached_file(os.path.expanduser(str(path_or_id)), RPT_CONFIG_NAME, _raise_exceptions_for_missing_entries=False,
                       _raise_exceptions_for_connection_errors=False, **lookup)


def read_rpt_config(path_or_id: str | os.PathLike, **lookup) -> RPTConfig | None:
    """The checked ``rpt_config.json`` of ``path_or_id``; None when it has none (a plain causal LM).
    ``lookup``: ``cached_file``'s hub arguments (revision, cache_dir, token, local_files_only)."""
    path = rpt_config_file(path_or_id, **lookup)
    return None if path is None else load_rpt_config_file(path)


# ---- the offset table ----------------------------------------------------------------------------
def table_path(path_or_id: str | os.PathLike, **lookup) -> str:
    """The local file of a checkpoint's offset table: :data:`RPT_TABLE_NAME`, else the top-level
    :data:`LEGACY_TABLE_NAME` of older checkpoints."""
    from transformers.utils import cached_file

    path_or_id = str(path_or_id)
    for name in (RPT_TABLE_NAME, LEGACY_TABLE_NAME):
        found = cached_file(path_or_id, name, _raise_exceptions_for_missing_entries=False, **lookup)
        if found is not None:
            return found
    raise FileNotFoundError(f"{path_or_id} has {RPT_CONFIG_NAME} but no offset table ({RPT_TABLE_NAME} or "
                          f"{LEGACY_TABLE_NAME}): copy the whole checkpoint directory, or re-save the model")


def read_offset_table(path_or_id: str | os.PathLike, config: RPTConfig, hidden: int, **lookup) -> dict[str, Any]:
    """The offset table tensors of a checkpoint (:data:`TABLE_KEY`, and :data:`TIED_TABLE_KEY` where
    saved), each checked to be a floating ``[window + 1, hidden]`` matrix before it is read: a table
    of another shape is an error naming the file, never broadcast into the model's table."""
    from safetensors import SafetensorError, safe_open

    file = table_path(path_or_id, **lookup)
    expected = [config.window + 1, hidden]
    try:
        with safe_open(file, framework="pt") as f:
            keys = set(f.keys())
            if TABLE_KEY not in keys:
                raise CheckpointError(f"{file} has no tensor {TABLE_KEY!r} (it holds {sorted(keys)[:4]}); {_FIX}")
            tensors = {}
            for key in (TABLE_KEY, TIED_TABLE_KEY):
                if key not in keys:
                    continue
                shape = list(f.get_slice(key).get_shape())
                if shape != expected:
                    raise CheckpointError(f"{file} tensor {key!r} has shape {shape}, but {config.path} says window "
                                          f"{config.window} and the model's hidden size is {hidden}: it must be {expected} "
                                          f"(one row per offset); {_FIX}")
                tensors[key] = f.get_tensor(key)
                if not tensors[key].is_floating_point():
                    raise CheckpointError(f"{file} tensor {key!r} is {tensors[key].dtype}, not a floating table; {_FIX}")
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{file} cannot be read as safetensors ({str(e).strip()[:200]}); the file is damaged: "
                              f"{_FIX}") from None
    return tensors


# ---- may this checkpoint be decoded with RPT? -----------------------------------------------------
def check_window_covers(trained: int, requested: int, source: str, name: str = "rpt_window") -> None:
    """The requested RPT window (``name``: how the caller spells it) is at most the trained one."""
    if requested > trained:
        flag = name if name.startswith("--") else f"{name}="
        sep = " " if name.startswith("--") else ""
        raise ValueError(f"{flag}{sep}{requested} is larger than the window {trained} that {source} was trained with; "
                         f"use {flag}{sep}{trained} or less")


_ANNOUNCED: set[str] = set()


def check_rpt_objective(objective: str | None, rpt_iters: int, source: str, name: str = "rpt_iters",
                        announce_unknown: bool = True) -> None:
    """RPT decoding (``rpt_iters > 0``) needs a model trained with the RPT objective: one trained
    with NTP only has untrained previous-token rows, so its "corrections" would be noise."""
    if rpt_iters == 0:
        return
    flag = f"{name} {rpt_iters}" if name.startswith("--") else f"{name}={rpt_iters}"
    if objective == "ntp":
        raise ValueError(f"{source} was trained with objective ntp (its {RPT_CONFIG_NAME} says so): its previous-token "
                         f"predictions are untrained, so {flag} would decode with them; use {name} 0, or fine-tune with "
                         "objective: rpt")
    if objective is None and announce_unknown and source not in _ANNOUNCED:
        _ANNOUNCED.add(source)  # one line per checkpoint, however many settings a script checks
        print(f"note: {source} does not record its training objective (written before rpt recorded it); decoding "
              f"with {flag} as if it was trained with RPT", file=sys.stderr)
