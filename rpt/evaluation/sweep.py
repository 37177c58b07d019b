"""Sampling sweeps of the model-based benchmark scripts (HumanEval, GSM8K).

The paper evaluates every benchmark at ``rpt_iters`` in {0, 1, 2} x ``temperature`` in {0, 0.05,
0.1} and reports, per ``rpt_iters``, the best score over temperatures. This module holds what the
scripts share:

* :class:`Setting` / :func:`sweep_settings`: the settings (``rpt_iters`` outer, ``temperature``
  inner, in the order given), each turning a base :class:`SamplingConfig` into its own;
* :func:`generate_sweep`: completions for every (item, sample, setting), resumable through a
  :class:`~rpt.result_files.ResultStore` (key: item, sample index, checkpoint path, the weights'
  dtype, device type and files (:func:`weights_fingerprint`), the full sampling config, the prompt and
  whether the decode is compiled), with a progress bar, split across processes under
  ``accelerate launch``; each completion draws with a seed hashed from (seed, item, sample index,
  setting) (:func:`sample_seed`), so it does not depend on the batch size, the split or a resume; each
  records the decode that made it (``compiled``, ``eager``, or ``fallback`` after a compile failure);
* :func:`decoding_stats`, :func:`best_of_temperatures`, :func:`settings_table` and
  :func:`plot_sweep` for the reports.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from rpt.evaluation.batched_generation import generate_texts, process_state, split_across_processes
from rpt.result_files import ResultStore
from rpt.sampling.config import SamplingConfig
from rpt.sampling.loading import encode

# SamplingConfig fields the sweep sets itself (left out of add_sampling_args).
SWEPT_KNOBS = ("rpt_iters", "temperature")
_BATCH_STATS = ("new_tokens", "seconds", "forward_passes", "corrections")


@dataclass(frozen=True)
class Setting:
    """One point of the sweep."""

    rpt_iters: int
    temperature: float

    @property
    def name(self) -> str:
        return f"rpt{self.rpt_iters}_t{self.temperature:g}"

    def config(self, base: SamplingConfig) -> SamplingConfig:
        """``base`` with this setting's knobs (validated: a bad value raises ``ValueError``)."""
        return dataclasses.replace(base, rpt_iters=self.rpt_iters, temperature=self.temperature)

    def as_dict(self) -> dict:
        return {"name": self.name, "rpt_iters": self.rpt_iters, "temperature": self.temperature}


def add_sweep_args(parser: argparse.ArgumentParser) -> None:
    """``--rpt-iters K [K ...]`` and ``--temperatures T [T ...]`` (defaults: 0 and greedy)."""
    group = parser.add_argument_group("sweep")
    group.add_argument("--rpt-iters", type=int, nargs="+", default=[0], metavar="K",
                       help="RPT iterations to sweep (paper: 0 1 2; default: %(default)s)")
    group.add_argument("--temperatures", type=float, nargs="+", default=[0.0], metavar="T",
                       help="temperatures to sweep (paper: 0 0.05 0.1; default: %(default)s)")


def sweep_settings(rpt_iters: Sequence[int], temperatures: Sequence[float]) -> list[Setting]:
    """The product, ``rpt_iters`` outer, in the order given, duplicates dropped."""
    for k in rpt_iters:
        if k < 0:
            raise ValueError(f"--rpt-iters {k} is invalid: use integers >= 0 (0 = plain next-token sampling)")
    for t in temperatures:
        if not t >= 0:
            raise ValueError(f"--temperatures {t} is invalid: use 0 (greedy) or a positive temperature")
    return list(dict.fromkeys(Setting(int(k), float(t)) for k in rpt_iters for t in temperatures))


def hub_snapshot(checkpoint: str) -> str | None:
    """The local hub-cache snapshot directory a hub id resolves to now (``refs/main`` of the cache), or
    None (not a hub id, or not in the cache)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(checkpoint, "config.json")
    except Exception:  # noqa: BLE001 -- a local path or another string the hub rejects as an id: no snapshot
        return None
    return os.path.dirname(found) if isinstance(found, str) else None


def weights_fingerprint(checkpoint: str, model) -> str:
    """What the completions depend on beyond the path: the weights' dtype and device type (bf16 and
    float32, or CPU and CUDA kernels, may pick different tokens) and the weights themselves: for a
    local checkpoint the size and modification time of each top-level file (a checkpoint retrained in
    place is new); for a hub id the snapshot the cache holds (its commit, and its files likewise), so a
    model updated in the cache to another snapshot generates anew instead of reusing the old one's
    completions."""
    param = next(model.parameters())
    parts = [str(param.dtype), param.device.type]
    path = os.path.expanduser(checkpoint)
    if not os.path.isdir(path):
        snapshot = hub_snapshot(checkpoint)
        commit = getattr(getattr(model, "config", None), "_commit_hash", None)  # the one transformers loaded
        if snapshot is not None and commit and os.path.basename(snapshot) != commit:
            snapshot = os.path.join(os.path.dirname(snapshot), commit)  # that commit's files, not the newer ones        if snapshot is None and commit is None:
            parts.append(f"unresolved:{uuid.uuid4().hex}")  # weights not known by content: never reused
        else:
            parts.append(f"commit:{commit or os.path.basename(snapshot)}")
        path = snapshot or path
    if os.path.isdir(path):
        for entry in sorted(os.scandir(path), key=lambda e: e.name):
            if entry.is_file():
                stat = entry.stat()
                parts.append(f"{entry.name}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]


def generation_key(checkpoint: str, config: SamplingConfig, item_id, sample: int, prompt: str, weights: str = "",
                   compile: bool = False) -> str:
    """Resume key of one completion: everything it depends on (``weights``: :func:`weights_fingerprint`).

    A deterministic config (greedy, no sampled PTP proposals) gives every sample of an item the
    same key, so the completion is generated once and reused for all ``n_samples``. Compiled
    completions are kept apart from eager ones (``compile``: inductor's kernels may move a near tie in
    bf16, as another dtype does), so a run resumed with another ``--compile`` generates anew instead of
    mixing the two; an eager key is what it was before, so stores written then resume as before.
    """
    if os.path.exists(os.path.expanduser(checkpoint)):
        checkpoint = os.path.abspath(os.path.expanduser(checkpoint))
    sample = 0 if config.deterministic else sample
    spec = {"checkpoint": checkpoint, "weights": weights, "config": dataclasses.asdict(config), "item": item_id,
            "sample": sample, "prompt": prompt}
    if compile:
        spec["compile"] = compile
    spec = json.dumps(spec, sort_keys=True, default=str)
    return f"gen:{item_id}:{sample}:{hashlib.sha1(spec.encode()).hexdigest()[:20]}"


def sample_seed(seed: int, item_id, sample: int, setting: str) -> int:
    """The row seed of one completion: a hash of (seed, item, sample index, setting), so a completion
    does not depend on the batch it is decoded in, the process split or a resume, and the samples of
    one item (or one item under two settings) share no draws."""
    digest = hashlib.sha1(json.dumps([seed, str(item_id), sample, setting]).encode()).hexdigest()
    return int(digest[:15], 16)  # 60 bits: an int64 row seed


def _state():
    return process_state()


def is_main_process() -> bool:
    return _state().is_main_process


def process_device(device: str) -> str:
    """Under ``accelerate launch`` a bare ``cuda`` becomes this process's GPU."""
    state = _state()
    return str(state.device) if state.num_processes > 1 and device == "cuda" else device


def open_store(out: str | Path, fresh: bool = False) -> ResultStore:
    """The run's :class:`ResultStore`; with several processes the main one clears it (``fresh``) first."""
    state = _state()
    if state.num_processes == 1:
        return ResultStore(out, fresh=fresh)
    store = ResultStore(out, fresh=fresh) if state.is_main_process else None
    state.wait_for_everyone()
    return store if store is not None else ResultStore(out)


def generate_sweep(
    model, tokenizer, items: Sequence[dict], settings: Sequence[Setting], base: SamplingConfig, *,
    checkpoint: str, store: ResultStore, n_samples: int = 1, batch_size: int = 8, desc: str = "generate",
    too_long: str = "shorten it", compile: bool = False,
) -> dict[str, list[dict]]:
    """Completions of ``items`` (``{"id", "prompt"}``) under every setting.

    Returns setting name -> records in item order, then sample order: ``id``, ``sample``,
    ``completion`` (cut at the config's stop strings), ``new_tokens``, ``finish_reason``, ``batch``
    (the decoding stats of the batch that produced it, for :func:`decoding_stats`). Completions
    already in ``store`` are not generated again. Under ``accelerate launch`` each process
    generates its share of the items and every process gets all records back. Completion (item,
    sample j, setting) draws with :func:`sample_seed` ``(base.seed or 0, item, j, setting)``: it does
    not depend on ``batch_size``, the process split or a resume. A prompt that fills the model's
    context stops the run before any generation, with ``too_long`` as the fix to try.
    """
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    encode(tokenizer, list(items), model, fix=too_long)  # every prompt fits the context: one clear error, up front
    mine, gather = split_across_processes(list(items))
    seed = 0 if base.seed is None else base.seed  # an evaluation is reproducible without --seed
    weights = weights_fingerprint(checkpoint, model)  # another --dtype or a retrained checkpoint: new completions
    out: dict[str, list[dict]] = {}
    with tqdm(total=len(settings) * len(mine) * n_samples, desc=desc, unit="gen",
              disable=not is_main_process()) as bar:
        for setting in settings:
            config = setting.config(base)
            jobs = [(item, j, generation_key(checkpoint, config, item["id"], j, item["prompt"], weights, compile))
                    for item in mine for j in range(n_samples)]
            todo: dict[str, dict] = {}
            seeds: dict[str, int] = {}
            weight: dict[str, int] = {}
            for item, j, key in jobs:
                if key not in store:
                    todo.setdefault(key, item)
                    # a deterministic config shares one key for all samples: seed it as sample 0
                    seeds.setdefault(key, sample_seed(seed, item["id"], 0 if config.deterministic else j,
                                                      setting.name))
                    weight[key] = weight.get(key, 0) + 1
            bar.set_postfix_str(setting.name)
            bar.update(len(jobs) - sum(weight.values()))
            keys = sorted(todo, key=lambda k: len(todo[k]["prompt"]))  # similar lengths, less padding
            for start in range(0, len(keys), batch_size):
                chunk = keys[start : start + batch_size]
                # each completion keyed by (item, sample, setting), whatever batch it lands in
                outs = generate_texts(model, tokenizer, [todo[k]["prompt"] for k in chunk], config, len(chunk),
                                      row_seeds=[seeds[k] for k in chunk], compile=compile)
                batch = {"id": uuid.uuid4().hex[:12], **{s: outs[0]["stats"][s] for s in _BATCH_STATS},
                         "path": outs[0]["path"]}  # compiled, eager, or fallback (after a compile failure)
                for key, o in zip(chunk, outs):
                    store.add(key, {"completion": o["text"], "new_tokens": len(o["new_ids"]),
                                    "finish_reason": o["finish_reason"], "batch": batch})
                bar.update(sum(weight[k] for k in chunk))
            out[setting.name] = gather([{"id": item["id"], "sample": j, **store.get(key)} for item, j, key in jobs])
    return out


def decoding_stats(records: Sequence[dict]) -> dict:
    """Totals over the batches that produced ``records``: tokens/s, model calls per token, corrections,
    and ``decoded_by``: how many of ``records`` each decode made (``compiled`` / ``eager`` / ``fallback``;
    records stored before completions recorded it were eager: their keys say so)."""
    batches = {r["batch"]["id"]: r["batch"] for r in records}.values()
    totals = {s: sum(b[s] for b in batches) for s in _BATCH_STATS}
    new, seconds = totals["new_tokens"], totals["seconds"]
    return {
        "tokens_per_s": new / seconds if seconds > 0 else 0.0,
        "calls_per_token": totals["forward_passes"] / max(new, 1),
        "corrections": int(totals["corrections"]),
        "new_tokens": int(new),
        "seconds": seconds,
        "decoded_by": dict(Counter(r["batch"].get("path", "eager") for r in records)),
    }


def fallback_note(name: str, decoded_by: dict) -> str | None:
    """One line when compile failures made some of a setting's completions eagerly (None otherwise)."""
    fallback = decoded_by.get("fallback", 0)
    if not fallback:
        return None
    return (f"note: {name}: {fallback} of {sum(decoded_by.values())} completions were decoded eagerly after a compile "
            "failure (compile_fallback; their tokens/s are eager ones)")


def best_of_temperatures(rows: Sequence[dict], metric: str) -> dict[str, dict]:
    """Per ``rpt_iters`` (JSON key ``str(k)``), the best ``metric`` over temperatures (first on ties)."""
    best: dict[str, dict] = {}
    for row in rows:
        key = str(row["rpt_iters"])
        if row.get(metric) is None:
            continue
        if key not in best or row[metric] > best[key][metric]:
            best[key] = {"rpt_iters": row["rpt_iters"], "temperature": row["temperature"], metric: row[metric]}
    return best


def settings_table(rows: Sequence[dict], metrics: Sequence[str]) -> tuple[list[str], list[list]]:
    """Markdown ``(headers, rows)``: one line per setting with ``metrics`` and the decoding stats."""
    headers = ["rpt_iters", "temperature", *metrics, "tokens/s", "calls/token", "corrections"]
    return headers, [[r["rpt_iters"], r["temperature"], *(r.get(m, "") for m in metrics), round(r["tokens_per_s"], 1),
                      round(r["calls_per_token"], 3), r["corrections"]] for r in rows]


def best_table(best: dict[str, dict], metric: str) -> tuple[list[str], list[list]]:
    """Markdown ``(headers, rows)`` of :func:`best_of_temperatures`."""
    return (["rpt_iters", f"best {metric} over temperatures", "at temperature"],
            [[b["rpt_iters"], b[metric], b["temperature"]] for b in best.values()])


def plot_sweep(rows: Sequence[dict], metric: str, title: str):
    """Bars of ``metric`` per setting, grouped by ``rpt_iters`` (one colour per temperature), each
    group labelled with its best over temperatures (the paper's figure)."""
    from matplotlib.figure import Figure

    iters = list(dict.fromkeys(r["rpt_iters"] for r in rows))
    temps = list(dict.fromkeys(r["temperature"] for r in rows))
    width = 0.8 / len(temps)
    fig = Figure(figsize=(max(4.0, 1.0 + 0.5 * len(rows) + 0.6 * len(iters)), 3.4))
    ax = fig.add_subplot()
    values = {(r["rpt_iters"], r["temperature"]): r[metric] or 0.0 for r in rows}
    for j, t in enumerate(temps):
        xs = [i + (j - (len(temps) - 1) / 2) * width for i, k in enumerate(iters) if (k, t) in values]
        ys = [values[k, t] for k in iters if (k, t) in values]
        bars = ax.bar(xs, ys, width * 0.95, label=f"T = {t:g}")
        ax.bar_label(bars, fmt="%.3f", fontsize=7)
    top = max(1.0, max(values.values(), default=0.0) * 1.15)
    for i, k in enumerate(iters):
        b = best_of_temperatures(rows, metric).get(str(k))
        if b is not None:
            ax.annotate(f"best over T: {b[metric]:.3f}", (i, b[metric]), xytext=(0, 14), textcoords="offset points",
                        ha="center", fontsize=8, fontweight="bold")
    ax.set_xticks(range(len(iters)), [f"RPT k = {k}" if k else "NTP (k = 0)" for k in iters])
    ax.set_ylabel(metric)
    ax.set_ylim(0.0, top)
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig
