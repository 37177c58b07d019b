"""One trained model of the scaling study measured on the validation split, per position, so that
intervals can resample positions (and seeds) later:

* the validation NTP and PTP-1 losses of the fine-tune's last evaluation (the whole split; per
  batch CE sums and counts, :func:`rpt.studies.seed_study.read_batches`);
* the error analysis's ``p_0(x_i)`` and ``p_1(x_i)`` (one RPT iteration, w = 2, the top-m
  estimator with its certified bound; :func:`rpt.studies.error_analysis.analysis.truth_probabilities`) under
  each PTP rule of :data:`RULES`;
* the PTP excess: the PTP head's loss ``-log P(x_i | x_<i, x_{i+1})`` minus that of the PTP its own
  NTP head implies, ``P*(a | b) ∝ p0(a) N(b | a)`` (exact, :func:`rpt.studies.error_analysis.analysis.ptp_vs_implied`).

Every model is measured at the same positions (:func:`fixed_positions`). A model's result is
written atomically to ``<dir>/<name>.json`` with the key it depends on (the checkpoint's weight
files and the settings); a rerun reads it back instead of measuring again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from rpt.result_files import write_json
from rpt.studies.error_analysis import analysis as ea
from rpt.studies.error_analysis.run import checkpoint_fingerprint, tokenise
from rpt.studies.scaling.design import Design
from rpt.studies.seed_study import mean_loss, read_batches

# The PTP rules of the error analysis: the demo's headline sampler (greedy PTP accepted above
# confidence 0.9, the paper's), the same at confidence 0, and eq. 4 as written (sampled PTP).
RULES = {"greedy_0.9": ea.PTPRule(greedy=True, confidence=0.9),
         "greedy_0": ea.PTPRule(greedy=True, confidence=0.0),
         "sampled_0": ea.PTPRule(greedy=False, confidence=0.0)}
BATCH = 16  # positions per forward of the error analysis
EXCESS_BATCH = 4  # V NTP queries per position: small batches


def validation_docs(tokenizer, val_fraction: float = 0.05) -> list[list[int]]:
    """The validation split of the demo's corpus (the standard library, split by file), each file
    tokenised without special tokens and preceded by EOS, as in training."""
    from rpt.data import stdlib_texts  # late: the tokenizer stack

    return tokenise(stdlib_texts("validation", val_fraction), tokenizer)


def fixed_positions(docs: Sequence[Sequence[int]], design: Design) -> tuple[list, list]:
    """The error analysis's positions (``design.positions`` drawn with ``design.position_seed``) and
    the PTP excess's (the first ``design.excess_positions`` of them with a next token)."""
    positions = ea.sample_positions([len(d) for d in docs], design.min_context, design.positions, design.position_seed)
    excess = [(d, t) for d, t in positions if t + 1 < len(docs[d])][:design.excess_positions]
    return positions, excess


def _context(doc: Sequence[int], t: int, context_len: int) -> list[int]:
    return list(doc[max(0, t - context_len):t])


@torch.no_grad()
def error_analysis(model, docs, positions, design: Design, pad: int) -> dict:
    """Per rule: ``p0``, ``p1`` (``p_k(x_i)`` at the true token) and ``bound`` (the certified
    ``|q_1 - p_1|``) per position."""
    out = {}
    for name, rule in RULES.items():
        t0 = time.perf_counter()
        p0, p1, bound = [], [], []
        for lo in range(0, len(positions), BATCH):
            part = positions[lo:lo + BATCH]
            res = ea.truth_probabilities(model, [_context(docs[d], t, design.context_len) for d, t in part],
                                         [docs[d][t] for d, t in part], iters=1, top_m=design.top_m, pad_id=pad,
                                         rule=rule)
            p0 += res.probs[:, 0].tolist()
            p1 += res.probs[:, 1].tolist()
            bound += res.bound[:, 1].tolist()
        out[name] = {"p0": p0, "p1": p1, "bound": bound}
        print(f"[scaling]   error analysis, {name}: {len(positions)} positions in {time.perf_counter() - t0:.0f} s",
              flush=True)
    return out


@torch.no_grad()
def ptp_excess(model, docs, positions, design: Design, pad: int) -> dict:
    """Per position the PTP head's loss and the NTP-implied PTP's loss (nats)."""
    head, implied = [], []
    t0 = time.perf_counter()
    for lo in range(0, len(positions), EXCESS_BATCH):
        part = positions[lo:lo + EXCESS_BATCH]
        loss = ea.ptp_vs_implied(model, [_context(docs[d], t, design.context_len) for d, t in part],
                                 [docs[d][t] for d, t in part], [docs[d][t + 1] for d, t in part], pad_id=pad)
        head += loss[:, 0].tolist()
        implied += loss[:, 1].tolist()
    print(f"[scaling]   PTP excess: {len(positions)} positions in {time.perf_counter() - t0:.0f} s", flush=True)
    return {"head": head, "implied": implied}


def losses(run_dir: Path) -> dict:
    """The fine-tune's last validation evaluation: mean NTP and PTP-1 losses and the per-batch sums."""
    b = read_batches(run_dir)
    return {"ntp": mean_loss(b, "ntp"), "ptp_1": mean_loss(b, "ptp_1"), "step": b["step"],
            "batch_sum": b["sum"].tolist(), "batch_count": b["count"].tolist()}


def measurement_key(checkpoint: str, design: Design) -> list:
    settings = {k: getattr(design, k) for k in ("positions", "top_m", "excess_positions", "min_context",
                                                 "context_len", "position_seed")}
    return [checkpoint_fingerprint(checkpoint), settings, sorted(RULES)]


def measure(name: str, run_dir: Path, out_dir: Path, design: Design, docs, positions, excess_positions,
            extra: dict) -> dict:
    """The model of fine-tune ``run_dir`` measured (or read back from ``out_dir/<name>.json``)."""
    from rpt.evaluation.batched_generation import load_checkpoint  # late: transformers

    checkpoint = str(run_dir / "final")
    key = measurement_key(checkpoint, design)
    path = out_dir / f"{name}.json"
    if path.exists():
        saved = json.loads(path.read_text())
        if saved.get("key") == json.loads(json.dumps(key)):
            print(f"[scaling] {name}: measured before, read back", flush=True)
            return saved
    t0 = time.perf_counter()
    model, _tokenizer, window = load_checkpoint(checkpoint, "cpu")
    if window is None or window < 2:
        raise ValueError(f"{checkpoint} is not an RPT checkpoint with a window of at least 2")
    pad = model.config.pad_token_id or 0
    result = {"name": name, "key": key, **extra, "checkpoint": checkpoint, "losses": losses(run_dir),
              "error_analysis": error_analysis(model, docs, positions, design, pad),
              "ptp_excess": ptp_excess(model, docs, excess_positions, design, pad)}
    result["seconds"] = time.perf_counter() - t0
    write_json(path, result)
    ea_ = result["error_analysis"]
    exc = np.subtract(result["ptp_excess"]["head"], result["ptp_excess"]["implied"]).mean()
    print(f"[scaling] {name}: measured in {result['seconds']:.0f} s: NTP {result['losses']['ntp']:.4f}, "
          f"PTP-1 {result['losses']['ptp_1']:.4f}, PTP excess {exc:+.4f}, eps_1 - eps_0 "
          + ", ".join(f"{r} {np.mean(np.subtract(v['p0'], v['p1'])):+.4f}" for r, v in ea_.items()), flush=True)
    return result
