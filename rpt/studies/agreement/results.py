"""The agreement study's results files: the JSON, the markdown report, the figure and the per-context
TVs (``<out>.tvs.npz``), written atomically; and a report re-rendered from written results.

The per-context TVs are what every context interval is computed from. A results JSON written before
they were saved (the official run's) gets its context intervals from a ``.tvs.npz`` put beside it
only when that file's context means equal every recorded model's TV0 / TV1
(:func:`rpt.studies.agreement.decomposition.check_per_context`): the per-context values of a retrain
that reproduced the recorded models, not of other models.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rpt.result_files import markdown_table, save_figure, sibling, write_json, write_npz, write_text
from rpt.studies.agreement import decomposition, study

TVS_SUFFIX = ".tvs.npz"
TITLE = "Where RPT wins: the agreement-pairs study"
INTERVALS = ("Intervals: *contexts* resamples the evaluation contexts (jointly across the seeds; the trained models "
             "fixed: what another evaluation set would give); *seeds+contexts* resamples the training seeds too (a "
             "two-way bootstrap; with 5 seeds its seed part is narrower than Student's t over them); *seeds (t)* is "
             "Student's t over the seed pairs (what another set of training seeds would give). Blank: not computable "
             "from what the run recorded.")


# ---- the per-context TVs ---------------------------------------------------------------------------------
def save_tvs(path: str | Path, tvs: dict, seeds: list[int], code: dict | None) -> Path:
    """``tvs[arm][window]`` (``[S, 2, n]``) with the seeds' order and the code's commit, as one ``.npz``."""
    arrays = {f"{arm}__{window}": np.asarray(tv, dtype=np.float64) for arm, by in tvs.items() for window, tv in by.items()}
    code = code or {}
    return write_npz(path, {**arrays, "seeds": np.asarray(seeds, dtype=np.int64),
                            "code_commit": np.asarray(str(code.get("commit"))), "code_dirty": np.asarray(str(code.get("dirty")))})


def load_tvs(path: str | Path) -> tuple[dict, list[int], dict]:
    """What :func:`save_tvs` wrote: ``(tvs, seeds, code)``."""
    with np.load(path) as z:
        tvs: dict = {}
        for key in z.files:
            if "__" in key:
                arm, window = key.split("__", 1)
                tvs.setdefault(arm, {})[window] = z[key]
        return tvs, [int(s) for s in z["seeds"]], {"commit": str(z["code_commit"]), "dirty": str(z["code_dirty"])}


# ---- the report ------------------------------------------------------------------------------------------
def _added(reg: dict) -> str:
    added = {f"{path}: {key}": v for path, p in reg.get("protocol", {}).items()
             for key, v in p["added_after_registration"].items()}
    return "; added to the config after the registration: " + ", ".join(f"{k} = {v}" for k, v in added.items()) if added else ""


def notes(summary: dict) -> str:
    p = summary["predictions"]
    reg = summary.get("preregistration")
    code = summary.get("code")
    return ("Official run of the pre-registered protocol "
            f"({reg['path']}, sha256 {reg['sha256'][:16]}..., commit {reg['commit'][:10]}{_added(reg)}). " if reg else
            "Development run (not the official seeds): not a result. ") + (
        f"{summary['metric']}. Seeds {summary['seeds']}, {summary['steps']} steps. "
        f"P2 {'held' if p['P2']['held'] else 'failed'}, co-primary {'held' if p['co_primary']['held'] else 'failed'}, "
        f"P1 {'held' if p['P1']['held'] else 'failed'}, P3 {'held' if p['P3']['held'] else 'failed'}, "
        f"P4 {'held' if p['P4']['held'] else 'failed'}. ") + (
        f"Code at commit {code['commit'][:10]}{' with uncommitted changes' if code['dirty'] else ''}; "
        f"the objective's draws keyed per {summary.get('draws')}. " if code and code.get("commit") else
        "The code's commit was not recorded by this run. ") + INTERVALS


def decomposition_section(summary: dict) -> str:
    d = summary.get("decomposition")
    if not d:
        return ""
    source = summary.get("per_context_tv")
    where = (f"Context intervals from the per-context TVs in `{source['path']}`"
             + (f" ({source['provenance']})" if source.get("provenance") else "") + "." if source else
             "The run recorded no per-context TVs: the context intervals shown are those it recorded for the same "
             "quantities (the sampling effect's is the arm table's TV1 - TV0, the q = 0.3 gap's P2's and the "
             "co-primary's); the training effect's needs the per-context TVs (blank).")
    text = ("## The gap decomposed: RPT sampling and RPT training (not registered: decides nothing)\n\n"
            "P2's gap, RPT TV1 - NTP TV0, is the sum of a **sampling effect**, RPT TV1 - RPT TV0 (one RPT iteration "
            "against the same model's NTP sampling), and a **training effect**, RPT TV0 - NTP TV0 (what the RPT "
            "objective does to the NTP head), seed by seed and context by context (seed s of each arm paired). "
            + where + "\n\n" + "\n".join(decomposition.summary_lines(d)) + "\n")
    return text + "\n" + markdown_table(*decomposition.table(d))


def markdown(summary: dict) -> str:
    parts = [f"# {TITLE}\n", notes(summary).rstrip() + "\n"]
    parts += [markdown_table(headers, rows) for headers, rows in study.markdown_tables(summary)]
    section = decomposition_section(summary)
    return "\n".join(parts + ([section] if section else []))


def write_outputs(out: str | Path, summary: dict) -> list[Path]:
    """``out`` (JSON), ``.md`` and ``.png`` beside it, and the summary's per-context ``tvs`` (if any) as
    ``.tvs.npz`` (named in the JSON's ``per_context_tv``)."""
    summary = dict(summary)
    tvs = summary.pop("tvs", None)
    paths = []
    if tvs is not None:
        npz = sibling(out, TVS_SUFFIX)
        paths.append(save_tvs(npz, tvs, summary["seeds"], summary.get("code")))
        summary["per_context_tv"] = {"path": npz.name, "provenance": "this run", "max_abs_diff_to_recorded_means":
                                     decomposition.check_per_context(summary["models"], summary["seeds"], tvs)}
    return [write_json(out, summary), write_text(sibling(out, ".md"), markdown(summary)),
            save_figure(study.plot(summary), sibling(out, ".png")), *paths]


def rereport(out: str | Path) -> list[Path]:
    """Re-render written results with the decomposition, from the recorded per-model means and, where a
    ``.tvs.npz`` lies beside ``out`` and reproduces them, the per-context TVs (context intervals, and the
    arm table's seeds+contexts intervals). Adds keys to the JSON; changes none it has. Raises
    ``ValueError`` when the ``.tvs.npz`` does not hold the recorded models' values."""
    summary = json.loads(Path(out).read_text(encoding="utf-8"))
    seeds = summary["seeds"]
    npz = sibling(out, TVS_SUFFIX)
    tvs = None
    if npz.exists():
        tvs, npz_seeds, code = load_tvs(npz)
        if npz_seeds != seeds:
            raise ValueError(f"{npz} holds seeds {npz_seeds}, {out} seeds {seeds}: not the same models")
        worst = decomposition.check_per_context(summary["models"], seeds, tvs)
        provenance = summary.get("per_context_tv", {}).get("provenance")
        if provenance != "this run":
            provenance = (f"scored from a retrain at commit {code['commit'][:10]}"
                          f"{' with uncommitted changes' if code['dirty'] == 'True' else ''} whose every model's context-mean "
                          f"TV0 and TV1 equal the recorded ones to {worst:.1e}")
        summary["per_context_tv"] = {"path": npz.name, "provenance": provenance, "max_abs_diff_to_recorded_means": worst}
        if all(a["arm"] in tvs for a in summary["arms"]):
            study.add_seeds_and_contexts_intervals(summary["arms"], tvs)
    summary["decomposition"] = decomposition.decompose(summary["models"], seeds, tvs)
    decomposition.add_recorded_context_intervals(summary["decomposition"], summary)
    return [write_json(out, summary), write_text(sibling(out, ".md"), markdown(summary)),
            save_figure(study.plot(summary), sibling(out, ".png"))]
