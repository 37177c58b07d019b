"""The degenerate-repetition study (LZ-penalty paper, Fig. 2): how often each sampler loops.

For every setting -- no penalty, the repetition-penalty sweep, the frequency-penalty sweep, the
LZ penalty, and RPT with the LZ penalty -- at each temperature, continuations of the same prompts
are generated and scored: **degenerate rate** (:func:`rpt.studies.repetition.metric.is_degenerate`:
some substring of at least ``min_len`` tokens repeated at least 20 times back to back) and, as a
quality measure beside it, the **log-likelihood of the continuation under the model's own NTP
distribution** (mean nats per token, higher is better; a penalty that avoids loops by emitting
unlikely text shows up here).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rpt.sampling.config import SamplingConfig
from rpt.studies.repetition.metric import is_degenerate

REPETITION_SWEEP = (1.1, 1.2, 1.25, 1.3, 1.5)
FREQUENCY_SWEEP = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
LZ_DEFAULT = (0.15, 512, 32)  # alpha, window, buffer


@dataclass(frozen=True)
class Setting:
    """One sampler of the study: ``family`` (none | repetition | frequency | lz | rpt_lz) at ``strength``."""

    family: str
    strength: float
    temperature: float
    overrides: tuple[tuple[str, object], ...] = ()

    @property
    def name(self) -> str:
        base = self.family if self.family in ("none", "lz", "rpt_lz") else f"{self.family}={self.strength:g}"
        return f"{base}@T={self.temperature:g}"

    def config(self, base: SamplingConfig) -> SamplingConfig:
        return dataclasses.replace(base, temperature=self.temperature, **dict(self.overrides))


def study_settings(
    temperatures: Sequence[float],
    repetition: Sequence[float] = REPETITION_SWEEP,
    frequency: Sequence[float] = FREQUENCY_SWEEP,
    lz: tuple[float, int, int] = LZ_DEFAULT,
    rpt_iters: int = 1,
    rpt_window: int = 2,
) -> list[Setting]:
    """Every setting of the study, in report order. ``rpt_iters=0`` leaves RPT + LZ out."""
    alpha, window, buffer = lz
    lz_over = (("lz_penalty", alpha), ("lz_window", window), ("lz_buffer", buffer))
    out: list[Setting] = []
    for t in temperatures:
        out.append(Setting("none", 0.0, t))
        out += [Setting("repetition", r, t, (("repetition_penalty", r),)) for r in repetition]
        out += [Setting("frequency", f, t, (("frequency_penalty", f),)) for f in frequency]
        out.append(Setting("lz", alpha, t, lz_over))
        if rpt_iters > 0:
            out.append(Setting("rpt_lz", alpha, t, (*lz_over, ("rpt_iters", rpt_iters), ("rpt_window", rpt_window))))
    return out


@torch.no_grad()
def continuation_loglik(model, prompt: list[int], continuation: list[int]) -> float:
    """Mean log-probability (nats per token) of ``continuation`` after ``prompt`` under NTP."""
    if not continuation:
        return float("nan")
    device = next(model.parameters()).device
    ids = torch.tensor([prompt + continuation], device=device)
    logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return float(-F.cross_entropy(logits, ids[0, len(prompt) :], reduction="mean"))


def score_continuation(model, prompt: list[int], continuation: list[int], min_len: int, min_repeats: int) -> dict:
    return {
        "degenerate": is_degenerate(continuation, min_len=min_len, min_repeats=min_repeats),
        "loglik": continuation_loglik(model, prompt, continuation),
        "new_tokens": len(continuation),
    }


def summarise(settings: Sequence[Setting], records: dict[str, list[dict]]) -> list[dict]:
    """Per setting: degenerate rate, mean log-likelihood, mean length, over its prompts."""
    rows = []
    for s in settings:
        recs = records.get(s.name, [])
        lls = [r["loglik"] for r in recs if not math.isnan(r["loglik"])]
        rows.append({
            "setting": s.name, "family": s.family, "strength": s.strength, "temperature": s.temperature,
            "n": len(recs),
            "degenerate_rate": sum(r["degenerate"] for r in recs) / len(recs) if recs else None,
            "mean_loglik": sum(lls) / len(lls) if lls else None,
            "mean_new_tokens": sum(r["new_tokens"] for r in recs) / len(recs) if recs else None,
            # the decode that made each record (records stored before they said so were eager: their keys say so)
            "decoded_by": dict(Counter(r.get("path", "eager") for r in recs)),
        })
    return rows


def plot_study(rows: Sequence[dict]):
    """Degenerate rate (left) and log-likelihood (right) against penalty strength, per temperature."""
    from matplotlib.figure import Figure

    temps = sorted({r["temperature"] for r in rows})
    fig = Figure(figsize=(11, 3.6 * len(temps)))
    for i, t in enumerate(temps):
        for j, (key, label) in enumerate((("degenerate_rate", "degenerate rate"), ("mean_loglik", "log-likelihood (nats/token)"))):
            ax = fig.add_subplot(len(temps), 2, 2 * i + j + 1)
            at_t = [r for r in rows if r["temperature"] == t and r[key] is not None]
            for family, marker in (("repetition", "o"), ("frequency", "s")):
                pts = sorted((r["strength"], r[key]) for r in at_t if r["family"] == family)
                if pts:
                    ax.plot(*zip(*pts), marker=marker, label=f"{family} penalty")
            for family, style in (("none", ":"), ("lz", "--"), ("rpt_lz", "-.")):
                for r in at_t:
                    if r["family"] == family:
                        ax.axhline(r[key], linestyle=style, color={"none": "gray", "lz": "tab:red", "rpt_lz": "tab:green"}[family],
                                   label={"none": "no penalty", "lz": "LZ penalty", "rpt_lz": "RPT + LZ"}[family])
            ax.set_title(f"{label}, T = {t:g}")
            ax.set_xlabel("penalty strength")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
