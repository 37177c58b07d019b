"""Training configuration: one dataclass, YAML files, ``key=value`` overrides, clear errors.

A YAML file may start from another with ``base: other.yaml`` (a path relative to the file);
keys it sets replace the base's. Command-line overrides use dotted keys for nested mappings
(``model.hidden_size=128``) and YAML syntax for values (``lr=3e-4``, ``data=[...]``).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any

import yaml

from rpt.errors import ConfigError, DataError
from rpt.training.config_keys import (
    check_lora_section,
    check_model_keys,
    check_source_keys,
    check_tokenizer_keys,
)


@dataclass
class TrainConfig:
    """One training run's settings: every field is a config key (docs/training.md lists them all).

    Read one with :func:`load_config` (a YAML file plus ``key=value`` overrides, validated); a
    ``TrainConfig`` built directly is checked by :func:`validate`. Train it with :func:`rpt.training.loop.run`.
    The main fields are below; the others (evaluation, saving, precision, compile, LoRA, logging) are
    described on their own lines.

    Args:
        model: an HF id, a local path, or a from-config spec ``{"model_type": "llama", ...}``.
        data, val_data: the text sources (docs/data.md); without ``val_data`` a ``val_fraction`` of the
            documents is held out.
        tokenizer: an id or path, ``{"train_bpe": {"vocab_size": N}}``, or ``None`` for the model's.
        objective, window, s, q: ``"rpt"`` (the permuted-window objective over ``window`` tokens,
            swap rates ``s`` and ``q``) or ``"ntp"``.
        seq_len, micro_batch_size, grad_accum, global_batch_size: the batch; ``max_steps``, ``lr`` and
            the schedule keys the optimisation; ``output_dir`` where the run writes.

    Raises:
        rpt.errors.ConfigError: from :func:`load_config` / :func:`validate`, one line naming the key and the fix.

    Example:
        >>> from rpt.training.config import TrainConfig, load_config, validate
        >>> cfg = TrainConfig(model={"model_type": "llama", "hidden_size": 16}, data={"stdlib": {}},
        ...                   micro_batch_size=4, grad_accum=2)
        >>> validate(cfg)
        >>> cfg.global_batch(processes=2)  # sequences per optimizer step
        16
        >>> load_config(overrides=["model=gpt2", "data={stdlib: {}}", "lr=3e-4"]).lr
        0.0003
        >>> validate(TrainConfig(model="gpt2", data={"stdlib": {}}, window=1))
        Traceback (most recent call last):
        ...
        rpt.errors.ConfigError: config key 'window' = 1 is invalid: use an integer in [2, 4096] (the paper uses 3)
    """

    # model: an HF id, a local path, or a from-config spec {"model_type": "llama", ...}
    model: Any = None
    init_from: str | None = None  # start from this checkpoint's weights (RPT or plain HF)
    tokenizer: Any = None  # id/path, {"train_bpe": {"vocab_size": N}}, or None = the model's
    # data: one source or a list; each {"stdlib": {...}} | {"path": F, "text_field": "text"} |
    # {"hub": NAME, "split": S, "text_field": T, "config": C}, with "weight" and "streaming";
    # or {"tokens": DIR}, a store written by prepare_data.py (see rpt/data/)
    data: Any = None
    val_data: Any = None  # same forms; None = hold out val_fraction of the documents (by text hash)
    val_fraction: float = 0.05
    cache_dir: str = "runs/cache"  # token stores prepared on the fly, trained tokenizers
    shuffle_buffer: int = 10_000  # streamed data: documents in the shuffle buffer (0 = stream order)
    data_workers: int = 1  # streamed data: DataLoader workers tokenising and packing ahead (0 = inline)
    tokenize_workers: int = 1  # processes that tokenise a corpus into a token store
    seq_len: int = 256
    objective: str = "rpt"  # rpt | ntp
    window: int = 3
    s: float = 0.5
    q: float = 0.02
    # sequences per optimizer step over all processes; with it the accumulation follows from the
    # micro-batch and the process count (None: micro_batch_size x grad_accum x processes)
    global_batch_size: int | None = None
    micro_batch_size: int | str = 8  # sequences per forward; "auto": the largest the device holds (rpt/training/micro_batch.py)
    grad_accum: int | None = None  # None: global_batch_size / (micro_batch_size x processes), or 1 without it
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    schedule: str = "cosine"  # cosine | linear | constant
    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    max_grad_norm: float = 1.0
    max_steps: int = 1000
    eval_every: int = 100
    eval_batches: int = 8
    log_every: int = 10
    save_every: int = 500
    keep_last: int = 2
    seed: int = 0
    # how the RPT objective's permutation draws are keyed (rpt.training.step): "sequence" (per sequence of
    # the global batch; the split does not change what is trained) or "micro_batch" (per global
    # micro-batch: how a checkpoint that records no keying was trained; the registered studies' runs); None:
    # "sequence" for a new run, the checkpoint's keying for a resume
    draws: str | None = None
    precision: str = "fp32"  # fp32 | bf16 | fp16
    loss_chunk_mb: int = 32  # the loss computes float32 logits for this many MB of them at a time
    peak_tflops: float | None = None  # per-device peak for the MFU estimate (None: known GPUs only)
    gradient_checkpointing: bool = False
    # torch.compile each transformer block (rpt/training/compiled_blocks.py); evaluation stays eager
    compile: bool = False
    compile_backend: str = "inductor"  # inductor | aot_eager (traces fwd + bwd, no code generation) | eager
    # LoRA: {r, alpha, dropout, target_modules} (PEFT LoraConfig fields); the offset table trains in
    # full beside the adapter, final/ is a PEFT adapter directory plus the table (rpt/model/lora.py)
    lora: Any = None
    attn_implementation: str | None = None  # sdpa | eager | flash_attention_2 | None (HF default)
    output_dir: str = "runs/default"
    resume: str = "auto"  # auto | none | a checkpoint path
    report_to: str = "none"  # none | wandb | tensorboard
    project: str = "rpt"
    run_name: str | None = None
    plot: bool = True

    def global_batch(self, processes: int) -> int:
        """Samples per optimizer step over all processes."""
        if self.global_batch_size is not None:
            return self.global_batch_size
        return self.micro_batch_size * (self.grad_accum or 1) * processes

    def eval_batch_rows(self) -> int:
        """Sequences per validation batch: the micro-batch, or with ``micro_batch_size: auto`` the global
        batch (run in forwards of the chosen micro-batch), so that the validation set is the same
        whatever the device holds."""
        return self.global_batch_size if self.micro_batch_size == "auto" else self.micro_batch_size

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
CHOICES = {
    "objective": ("rpt", "ntp"),
    "schedule": ("cosine", "linear", "constant"),
    "precision": ("fp32", "bf16", "fp16"),
    "report_to": ("none", "wandb", "tensorboard"),
    "compile_backend": ("inductor", "aot_eager", "eager"),
    "draws": (None, "sequence", "micro_batch"),  # rpt.training.step's DRAWS and LEGACY_DRAWS (tests/studies/test_agreement.py holds them equal)
    "attn_implementation": (None, "sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention"),
}


def yaml_error_text(e: yaml.YAMLError) -> str:
    """PyYAML's error on one line: its own text spans lines (a copy of the line, a caret under it)."""
    mark = getattr(e, "problem_mark", None)
    what = " ".join(str(p) for p in (getattr(e, "context", None), getattr(e, "problem", None)) if p) or str(e)
    return f"line {mark.line + 1}: {' '.join(what.split())}" if mark else " ".join(what.split())


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} appears twice in one mapping "
                                                        "(which one was meant?)", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def _load_yaml(path: str, chain: tuple[str, ...] = ()) -> dict[str, Any]:
    if os.path.isdir(path):
        raise ConfigError(f"config file {path} is a directory; pass --config configs/<name>.yaml")
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path} does not exist; pass --config configs/<name>.yaml")
    if os.path.realpath(path) in chain:
        raise ConfigError(f"config file {path} is its own base (base: chain {' -> '.join(chain + (os.path.realpath(path),))}); "
                          "remove the cycle")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ConfigError(f"config file {path} cannot be read ({e.strerror or e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError(f"config file {path} line {line} is not UTF-8 text (byte {data[e.start]:#04x}); save it "
                          "as UTF-8") from None
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML ({yaml_error_text(e)})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must be a mapping of keys to values")
    base = raw.pop("base", None)
    if base is None:
        return raw
    if not isinstance(base, str) or not base:
        raise ConfigError(f"config file {path} key 'base' = {base!r} must name another YAML file (relative to {path})")
    merged = _load_yaml(os.path.join(os.path.dirname(path), base), chain + (os.path.realpath(path),))
    merged.update(raw)
    return merged


def parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key=value (e.g. lr=3e-4)")
    key, value = item.split("=", 1)
    try:
        parsed = yaml.safe_load(value) if value != "" else None
    except yaml.YAMLError:
        parsed = value
    return key.strip().split("."), parsed


AUTO_KEYS = ("micro_batch_size",)  # keys that also take the value "auto"


def _coerce(name: str, value: Any) -> Any:
    f = FIELDS[name]
    if name in AUTO_KEYS and value == "auto":
        return value
    typ = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    if "Any" in typ or (value is None and "None" in typ):
        return value
    if value is None:
        raise ConfigError(f"config key {name!r} needs a value (got an empty value or null); e.g. {name}={f.default!r}")
    if isinstance(value, str) and typ.split(" ")[0] in ("int", "float"):
        try:  # YAML 1.1 reads "1e-3" (no dot) as a string
            value = float(value)
        except ValueError:
            pass
    if typ.startswith("int") and isinstance(value, float) and value.is_integer():
        value = int(value)
    if typ.startswith("float") and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if typ.startswith("str") and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    expected = {"int": int, "float": float, "bool": bool, "str": str}[typ.split(" ")[0]]
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise ConfigError(f"config key {name!r} must be {expected.__name__}, got {value!r}")
    if expected is float and not math.isfinite(value):
        raise ConfigError(f"config key {name!r} = {value!r} is not a finite number; use a finite value (e.g. {name}={f.default!r})")
    return value


def load_config(path: str | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Read ``path`` (YAML), apply ``key=value`` overrides, validate; errors name the key."""
    raw = _load_yaml(path) if path else {}
    for item in overrides or []:
        keys, value = parse_override(item)
        target = raw
        for k in keys[:-1]:
            if not isinstance(target.get(k), dict):
                target[k] = {}
            target = target[k]
        target[keys[-1]] = value
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise ConfigError(f"unknown config key {unknown[0]!r}; known keys: {', '.join(sorted(FIELDS))}")
    cfg = TrainConfig(**{k: _coerce(k, v) for k, v in raw.items()})
    validate(cfg)
    return cfg


def validate(cfg: TrainConfig) -> None:
    def bad(key: str, fix: str) -> ConfigError:
        return ConfigError(f"config key {key!r} = {getattr(cfg, key)!r} is invalid: {fix}")

    for key, allowed in CHOICES.items():
        if getattr(cfg, key) not in allowed:
            raise bad(key, f"use one of {', '.join(str(a) for a in allowed)}")
    if cfg.model is None and cfg.init_from is None:
        raise ConfigError("config key 'model' is missing: give an HF id, a local path, or {model_type: llama, ...}")
    if isinstance(cfg.model, dict) and "model_type" not in cfg.model:
        raise bad("model", "a from-config spec needs model_type (e.g. llama) plus config fields")
    if cfg.data is None:
        raise ConfigError("config key 'data' is missing: e.g. data: {stdlib: {}} or {path: corpus.jsonl}")
    from rpt.data.sources import check_sources  # late: rpt.data's __init__ imports torch

    try:
        check_sources(cfg.data, "data")
        if cfg.val_data is not None:
            check_sources(cfg.val_data, "val_data")
    except DataError as e:
        raise ConfigError(str(e)) from None
    check_source_keys(cfg.data, "data")
    if cfg.val_data is not None:
        check_source_keys(cfg.val_data, "val_data")
    check_tokenizer_keys(cfg.tokenizer)
    check_model_keys(cfg.model)
    check_batch_keys(cfg)
    if cfg.objective == "rpt" and str(cfg.attn_implementation).startswith("flash_attention") and cfg.micro_batch_size == 1:
        # transformers drops an all-ones mask and, for a batch of one, reads position_ids that are
        # not 0, 1, 2, ... as packed sequences (_is_packed_sequence): a swap would cut attention.
        raise bad("attn_implementation", "flash attention with micro_batch_size 1 reads an RPT-permuted sequence as "
                  "packed sequences and cuts attention at every swap; use attn_implementation: sdpa or micro_batch_size >= 2")
    from rpt.checkpoint.rpt_config import (
        MAX_WINDOW,  # late: rpt.checkpoint.rpt_config imports torch (through rpt.checkpoint.folded_weights)
    )

    if not 2 <= cfg.window <= MAX_WINDOW:
        raise bad("window", f"use an integer in [2, {MAX_WINDOW}] (the paper uses 3)")
    for key in ("s", "q", "val_fraction", "min_lr_ratio"):
        if not 0.0 <= getattr(cfg, key) <= 1.0:
            raise bad(key, "use a value in [0, 1]")
    for key in ("seq_len", "max_steps", "eval_every", "log_every", "save_every", "keep_last"):
        if getattr(cfg, key) < 1:
            raise bad(key, "use an integer >= 1")
    for key in ("warmup_steps", "eval_batches", "shuffle_buffer", "data_workers"):
        if getattr(cfg, key) < 0:
            raise bad(key, "use an integer >= 0")
    for key in ("tokenize_workers", "loss_chunk_mb"):
        if getattr(cfg, key) < 1:
            raise bad(key, "use an integer >= 1")
    if cfg.peak_tflops is not None and cfg.peak_tflops <= 0:
        raise bad("peak_tflops", "use the device's peak TFLOP/s (e.g. 989 for an H100 SXM in bf16) or leave it unset")
    if cfg.seq_len < cfg.window:
        raise bad("seq_len", f"sequences must be at least the window ({cfg.window}) long")
    if cfg.lr <= 0:
        raise bad("lr", "use a positive learning rate")
    for key in ("adam_beta1", "adam_beta2"):
        if not 0.0 <= getattr(cfg, key) < 1.0:
            raise bad(key, "use a value in [0, 1) (AdamW's moment decay)")
    if cfg.weight_decay < 0 or cfg.max_grad_norm < 0:
        raise ConfigError("config keys 'weight_decay' and 'max_grad_norm' must be >= 0 (0 disables clipping)")
    if cfg.lora is not None:
        problem = check_lora_section(cfg.lora)
        if problem:
            raise ConfigError(f"config key 'lora' = {cfg.lora!r} is invalid: {problem}")
    if cfg.resume not in ("auto", "none") and not os.path.isdir(cfg.resume):
        raise bad("resume", "use auto, none, or an existing checkpoint directory")



def check_batch_keys(cfg: TrainConfig) -> None:
    """The batch keys agree as far as they can without the process count (``rpt.training.micro_batch`` checks the rest)."""
    def bad(key: str, fix: str) -> ConfigError:
        return ConfigError(f"config key {key!r} = {getattr(cfg, key)!r} is invalid: {fix}")

    mbs, accum, total = cfg.micro_batch_size, cfg.grad_accum, cfg.global_batch_size
    if mbs != "auto" and (isinstance(mbs, bool) or not isinstance(mbs, int) or mbs < 1):
        raise bad("micro_batch_size", "use an integer >= 1 or auto (the largest micro-batch the device holds)")
    for key in ("grad_accum", "global_batch_size"):
        if getattr(cfg, key) is not None and getattr(cfg, key) < 1:
            raise bad(key, "use an integer >= 1 (or leave it unset)")
    if mbs == "auto":
        if total is None:
            raise bad("micro_batch_size", "auto needs global_batch_size, the sequences per optimizer step it keeps "
                      "(e.g. global_batch_size=64)")
        if accum is not None:
            raise bad("grad_accum", "micro_batch_size: auto chooses the accumulation that keeps global_batch_size; "
                      "remove grad_accum")
        if cfg.draws == "micro_batch":
            raise bad("draws", "draws keyed per micro-batch make what is trained depend on the micro-batch, which "
                      "micro_batch_size: auto chooses per device; set micro_batch_size to an integer, or draws: sequence")
    elif total is not None and total % (mbs * (accum or 1)):
        raise bad("global_batch_size", f"it is not a multiple of micro_batch_size {mbs}"
                  + (f" x grad_accum {accum}" if accum else "") + "; make it one, or leave grad_accum unset")
