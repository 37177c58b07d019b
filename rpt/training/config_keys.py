"""Keys inside the config's nested mappings: a typo is an error naming the key, its mapping and
the closest known key -- never a setting silently ignored (``spilt: validation`` reading the
train split, ``hiden_size: 64`` building the model type's default shape).

* data / val_data sources: the keys :mod:`rpt.data.sources` reads, per kind of source;
* ``tokenizer: {train_bpe: {...}}``;
* ``model: {model_type: ..., ...}``: the attributes of that model type's ``transformers`` config
  class (its ``__init__`` arguments, its defaults, its attribute aliases);
* ``lora: {r, alpha, dropout, target_modules}``: :func:`check_lora_section` (the section :mod:`rpt.model.lora` reads).
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Iterable
from typing import Any

from rpt.errors import ConfigError

COMMON_SOURCE_KEYS = {"weight"}
TEXT_SOURCE_KEYS = {"text_field", "streaming"}
SOURCE_KEYS = {
    "stdlib": {"stdlib", "streaming"},
    "path": {"path"} | TEXT_SOURCE_KEYS,
    "hub": {"hub", "config", "split", "revision", "data_dir", "data_files"} | TEXT_SOURCE_KEYS,
    "tokens": {"tokens"},
}
STDLIB_KEYS = {"max_files"}
TRAIN_BPE_KEYS = {"vocab_size"}
LEGACY_MODEL_KEYS = {"rope_theta", "rope_scaling"}


def check_keys(mapping: dict, known: Iterable[str], where: str) -> None:
    known = set(known)
    for key in mapping:
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(sorted(known))}"
            raise ConfigError(f"unknown key {key!r} in {where}; {hint}")


def check_source_keys(sources: Any, name: str) -> None:
    """Each source of ``data`` / ``val_data`` (already checked to be mappings of one kind)."""
    for i, source in enumerate(sources if isinstance(sources, list) else [sources]):
        kind = next(k for k in SOURCE_KEYS if k in source)
        where = f"{name}[{i}] ({kind} source)" if isinstance(sources, list) else f"{name} ({kind} source)"
        check_keys(source, SOURCE_KEYS[kind] | COMMON_SOURCE_KEYS, where)
        if kind == "stdlib" and isinstance(source["stdlib"], dict):
            check_keys(source["stdlib"], STDLIB_KEYS, f"{where[: -len(' (stdlib source)')]}.stdlib")


def check_tokenizer_keys(spec: Any) -> None:
    if isinstance(spec, dict):
        check_keys(spec, {"train_bpe"}, "tokenizer")
        if isinstance(spec["train_bpe"], dict):
            check_keys(spec["train_bpe"], TRAIN_BPE_KEYS, "tokenizer.train_bpe")


def model_config_keys(model_type: str) -> set[str]:
    """The keys a ``transformers`` config of ``model_type`` understands."""
    from transformers import CONFIG_MAPPING, PretrainedConfig

    if model_type not in CONFIG_MAPPING:
        close = difflib.get_close_matches(model_type, list(CONFIG_MAPPING.keys()), n=1)
        hint = f"did you mean {close[0]!r}?" if close else "use a transformers model type such as llama or qwen3"
        raise ConfigError(f"unknown model.model_type {model_type!r}; {hint}")
    cls = CONFIG_MAPPING[model_type]
    keys: set[str] = set()
    for klass in (cls, PretrainedConfig):
        keys |= set(inspect.signature(klass.__init__).parameters) - {"self", "kwargs"}
        keys |= set(getattr(klass, "attribute_map", {}) or {})
    try:
        default = cls()
    except Exception:  # a composite config that needs its parts: the signature has to do
        default = None
    if default is not None:
        keys |= set(default.to_dict()) | {a for a in dir(default) if not a.startswith("_")}  # defaults, properties
    # Accepted by transformers 5 as the legacy spelling of rope_parameters (converted, not dropped).
    return keys | LEGACY_MODEL_KEYS


def model_config_defaults(model_type: str) -> dict[str, Any]:
    """The default values of a ``transformers`` config of ``model_type`` (empty when it needs arguments)."""
    from transformers import CONFIG_MAPPING

    try:
        return CONFIG_MAPPING[model_type]().to_dict()
    except Exception:  # a composite config that needs its parts: nothing to compare against
        return {}


def _is_count(key: str) -> bool:
    """A size or a count of layers, heads or positions: 0 or less builds no model (or fails deep inside one)."""
    return key.startswith("num_") or key.endswith(("_size", "_layers", "_heads", "_embeddings", "head_dim"))


def _value_problem(key: str, value: Any, default: Any) -> str | None:
    """Why ``value`` cannot stand where the config's default is ``default`` (None: it can)."""
    if isinstance(default, bool):
        return None if isinstance(value, bool) else "true or false"
    if isinstance(default, int):
        if not isinstance(value, int) or isinstance(value, bool):
            return "an integer"
        return "an integer >= 1" if value < 1 and _is_count(key) else None
    if isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return None if ok else "a finite number"
    return None


def check_model_keys(spec: Any) -> None:
    if isinstance(spec, dict):
        model_type = str(spec["model_type"])
        fields = {k: v for k, v in spec.items() if k != "model_type"}
        check_keys(fields, model_config_keys(model_type), f"model (a {model_type} config)")
        defaults = model_config_defaults(model_type)
        for key, value in fields.items():
            default = defaults.get(key)
            if isinstance(value, str) and isinstance(default, float) and not isinstance(default, bool):
                try:  # YAML 1.1 reads "1e-5" (no dot) as a string
                    value = spec[key] = float(value)
                except ValueError:
                    pass
            # A number where the config holds one ("64" would reach the model's constructor as a string).
            problem = _value_problem(key, value, default)
            if problem:
                raise ConfigError(f"config key 'model.{key}' = {value!r} must be {problem} "
                                  f"(the {model_type} config's default is {defaults[key]!r})")


LORA_KEYS = {"r": int, "alpha": (int, float), "dropout": (int, float), "target_modules": (list, str)}


def check_lora_section(section: Any) -> str | None:
    """The problem with a config's ``lora:`` mapping, or None when it is fine."""
    if not isinstance(section, dict):
        return "use a mapping, e.g. lora: {r: 8, alpha: 16, dropout: 0.05, target_modules: [q_proj, v_proj]}"
    unknown = sorted(set(section) - set(LORA_KEYS))
    if unknown:
        return f"unknown key {unknown[0]!r}; known: {', '.join(LORA_KEYS)}"
    for key, typ in LORA_KEYS.items():
        if key in section and (not isinstance(section[key], typ) or isinstance(section[key], bool)):
            return f"{key} has the wrong type ({section[key]!r})"
    if any(not math.isfinite(section[k]) for k in ("alpha", "dropout") if k in section):
        return "alpha and dropout must be finite numbers"
    if int(section.get("r", 8)) < 1:
        return "r must be an integer >= 1"
    if not 0 <= float(section.get("dropout", 0.0)) < 1:
        return "dropout must be in [0, 1)"
    if float(section.get("alpha", 16)) <= 0:
        return "alpha must be > 0"
    targets = section.get("target_modules", "all-linear")
    if isinstance(targets, list) and not (targets and all(isinstance(t, str) and t for t in targets)):
        return "target_modules must be a non-empty list of module names or 'all-linear'"
    return None
