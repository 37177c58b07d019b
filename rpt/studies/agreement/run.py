"""The agreement study's runs (``eval/agreement.py``): the source written, 3 arms x the training seeds
trained with ``train.py`` (cached per run, so a rerun resumes), every model scored exactly, the
predictions summarised, JSON + markdown + figure written atomically.

The official seeds (training seeds 0-4 on source seed 0) run only the registered protocol and only
when ``docs/agreement_preregistration.md`` and ``configs/agreement.yaml`` hold what was registered, by
content (:mod:`rpt.studies.preregistration`); the record (sha256s, registration commit, HEAD, keys added
to the config since) goes into the results. Every run trains with the keying of the objective's draws that
``configs/agreement.yaml`` names (``draws``); the official seeds only with the one the protocol was registered
with (:data:`REGISTERED_DRAWS`), so that the official models retrain as they were trained (bit for bit in
one environment: torch, transformers and the CPU move the last digits). The results record the
keying, each model's own (from its ``final/training_config.yaml``), and the code's commit and whether
the work tree differed from it. Development uses another source seed or other training seeds.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import yaml

from rpt.result_files import write_json
from rpt.studies import owned_dirs
from rpt.studies.agreement import source as ag
from rpt.studies.agreement import study
from rpt.studies.controlled.run import ROOT, TrainJob, _losses, config_steps, run_jobs
from rpt.studies.controlled.source import SourceFiles
from rpt.studies.preregistration import NotPreregistered, Registration, check_preregistered
from rpt.training.step import DRAWS, LEGACY_DRAWS

CONFIG = "configs/agreement.yaml"
PREREGISTRATION = "docs/agreement_preregistration.md"
OFFICIAL_SOURCE_SEED = 0
OFFICIAL_SEEDS = (0, 1, 2, 3, 4)
OFFICIAL_OUT = "docs/agreement.json"
OWNER = "agreement study"  # names the writer in rpt.studies.owned_dirs' markers and refusals
# The commit that registered the protocol (docs/agreement_preregistration.md): its text is never
# changed, and the config's registered fields hold (keys added later are recorded in the results).
REGISTRATION = Registration(
    PREREGISTRATION, "64396e489cc5e13ed5a517ef10f862a79cbb5f40", (CONFIG,),
    fix="develop with another --source-seed or other --seeds than the official ones (training seeds 0-4 "
        "with source seed 0)")
# At the pre-registration commit the trainer keyed the objective's draws per global micro-batch only.
REGISTERED_DRAWS = LEGACY_DRAWS


class Refused(Exception):
    """A run the study will not do; the message is the one line to show."""


def is_official(design: ag.Design, seeds: Sequence[int]) -> bool:
    return design.source_seed == OFFICIAL_SOURCE_SEED and any(s in OFFICIAL_SEEDS for s in seeds)


def preregistration(root: Path, registration: Registration | None = None) -> dict:
    """The record of the registered protocol (:func:`rpt.studies.preregistration.check_preregistered`
    on :data:`REGISTRATION`): raises :class:`Refused` on any difference in the pre-registration or the
    config from what was registered."""
    try:
        return check_preregistered(root, registration or REGISTRATION)
    except NotPreregistered as e:
        raise Refused(str(e)) from None


def check_protocol(design: ag.Design, seeds: Sequence[int], steps: int | None, draws: str = REGISTERED_DRAWS) -> None:
    """The official seeds run the registered protocol only, with the keying it was registered with."""
    if list(seeds) != list(OFFICIAL_SEEDS) or steps is not None or design != ag.Design():
        raise Refused("the official seeds (training seeds 0-4 with source seed 0) run the registered protocol "
                      "only: --seeds 0 1 2 3 4 and no --steps/--contexts/--train-docs; for development use "
                      "another --source-seed or other --seeds")
    if draws != REGISTERED_DRAWS:
        raise Refused(f"the official seeds train with the keying of the objective's draws the protocol was registered "
                      f"with: set draws: {REGISTERED_DRAWS} in {CONFIG} (it names {draws}), or develop with another "
                      "--source-seed or other --seeds")


def config_draws(root: Path = ROOT, config: str = CONFIG) -> str:
    """The keying of the objective's draws ``config`` names (its ``draws``): a study states it."""
    draws = (yaml.safe_load((root / config).read_text(encoding="utf-8")) or {}).get("draws")
    if draws not in (DRAWS, LEGACY_DRAWS):
        raise Refused(f"{config} names draws: {draws!r}; a study states the keying of the objective's draws it trains "
                      f"with: {REGISTERED_DRAWS} (the registered protocol's) or {DRAWS}")
    return draws


def trained_draws(final: str | Path) -> str | None:
    """The keying a trained model's run used, from its ``training_config.yaml`` (None where it does not say)."""
    path = Path(final) / "training_config.yaml"
    return (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("draws") if path.exists() else None


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)


def code_state(root: Path = ROOT) -> dict:
    """The commit the code ran at and whether the work tree differed from it (untracked files count; the
    ignored, such as runs/, do not); both None where git cannot say."""
    if shutil.which("git") is None:
        return {"commit": None, "dirty": None}
    head, status = _git(root, "rev-parse", "HEAD"), _git(root, "status", "--porcelain")
    if head.returncode != 0 or status.returncode != 0:
        return {"commit": None, "dirty": None}
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}


def _source_cached(files: SourceFiles, design: ag.Design) -> bool:
    meta = Path(ag.meta_path(files.dir))
    return meta.exists() and ag.Design.from_dict(json.loads(meta.read_text())["design"]).source_dict() == design.source_dict()


def _stale_runs(work: Path) -> list[Path]:
    return [run for arm, _ in study.ARMS for run in work.glob(f"{arm}_s*") if run.is_dir()]


def check_work(work: Path, design: ag.Design, planned: Sequence[TrainJob]) -> None:
    """Every directory the study would delete or rewrite under ``work`` is its own (marked) or empty:
    raises :class:`Refused` before any work otherwise (:mod:`rpt.studies.owned_dirs`)."""
    files = SourceFiles(str(work / "source"))
    doomed = [] if _source_cached(files, design) else [Path(files.dir), *_stale_runs(work)]
    try:
        owned_dirs.check([*doomed, *(job.run_dir for job in planned if not job.cached())], OWNER, "delete")
    except owned_dirs.ForeignDirectory as e:
        raise Refused(str(e)) from None


def prepare_source(work: Path, design: ag.Design) -> SourceFiles:
    """The source under ``work/source`` (cached). Written anew when its design changed, and then the
    runs trained on the old samples are removed with it (only directories the study wrote)."""
    files = SourceFiles(str(work / "source"))
    if _source_cached(files, design):
        print(f"[agreement] source {files.dir}: cached", flush=True)
        return files
    for run in _stale_runs(work):
        owned_dirs.remove(run, OWNER)
    owned_dirs.fresh(files.dir, OWNER)
    return ag.write_source(files.dir, design)


def jobs(work: Path, files: SourceFiles, seeds: Sequence[int], steps: int | None,
         draws: str = REGISTERED_DRAWS) -> list[tuple[str, int, TrainJob]]:
    """One from-scratch run per (arm, seed), seed-major (a cut-short study still has every arm once);
    the seed sets the data order, so arms with the same seed index see the same batches. The keying
    is passed explicitly too, so that a run cached under another keying is not taken for this one."""
    base = [f"tokenizer={files.tokenizer}", f"data={{path: {files.train}}}", f"val_data={{path: {files.validation}}}",
            f"cache_dir={files.dir}/cache", f"draws={draws}", *([f"max_steps={steps}"] if steps is not None else [])]
    extra = {arm: (["objective=ntp"] if q is None else [f"q={q}"]) for arm, q in study.ARMS}
    return [(arm, s, TrainJob(CONFIG, work / f"{arm}_s{s}", [*base, *extra[arm], f"seed={s}"]))
            for s in seeds for arm, _ in study.ARMS]


def load_checkpoint(path: str):
    from rpt.sampling.loading import load_model, rpt_window_of  # late: transformers, for checkpoints

    window = rpt_window_of(path)
    if window is None or window < 2:
        raise Refused(f"{path} is not an RPT checkpoint with a window of at least 2")
    return load_model(path, window, "cpu", torch.float32)  # the sampler's one loader; trained in float32


def source_stats(design: ag.Design, params: ag.Params, cache: Path | None = None) -> dict:
    """What the truth alone says: entropies, the ideal validation loss, and the tag error left to the
    best log-additive model at each window type's hard token (kept in ``cache``, keyed by the design)."""
    if cache is not None and cache.exists():
        saved = json.loads(cache.read_text())
        if saved.get("design") == design.to_dict():
            return saved["stats"]
    laws = ag.history_laws(params, design)
    h = ag.entropy(params, design, laws)
    j = (design.tag_first_cut - design.prefix) // 2
    stats = {"entropy": h,
             # train.py's eval_ntp_loss averages doc_len targets per row (x_2..x_T, then EOS, ~0 once learned).
             "ideal_eval_ntp_loss": float((h["document"] - np.log(design.contents)) / design.doc_len),
             "log_additive_tag_fit": {"tag_first": _fit_summary(ag.log_additive_fit(params, design, j, laws)),
                                      "content_first": _fit_summary(ag.log_additive_fit(params, design, j + 1, laws))}}
    if cache is not None:
        write_json(cache, {"design": design.to_dict(), "stats": stats})
    return stats


def _fit_summary(fit: dict) -> dict:
    return {k: fit[k] for k in ("pair", "tv", "kl", "tv_of_uniform", "converged")}


def run(design: ag.Design, seeds: Sequence[int], work: Path, steps: int | None = None,
        train: Callable[[list[TrainJob]], None] | None = None, parallel: int = 2,
        root: Path | None = None) -> dict:
    """The whole study; ``train`` runs the not-yet-cached jobs (default: ``train.py`` processes,
    ``parallel`` at a time, one thread each). Raises :class:`Refused` before any work when refused.
    The summary's ``tvs`` (``tvs[arm][window]``: ``[S, 2, n]`` per-context TVs, seeds in ``seeds``'
    order) are numpy arrays: :func:`rpt.studies.agreement.results.write_outputs` writes them beside the JSON."""
    if steps is not None and steps < 1:
        raise Refused(f"steps {steps}: a run trains at least 1 step (None: the config's {config_steps(CONFIG)})")
    prereg, draws, code = None, config_draws(), code_state()
    if is_official(design, seeds):
        check_protocol(design, seeds, steps, draws)
        prereg = preregistration(root or ROOT)
    t0 = time.perf_counter()
    planned = jobs(work, SourceFiles(str(work / "source")), seeds, steps, draws)
    todo = [job for *_, job in planned]
    check_work(work, design, todo)
    files = prepare_source(work, design)
    if train is None:
        run_jobs(todo, parallel, OWNER)  # skips (and reports) the cached runs itself
    else:
        fresh = [j for j in todo if not j.cached()]
        for job in fresh:
            owned_dirs.fresh(job.run_dir, OWNER)
        train(fresh)
    t1 = time.perf_counter()
    params = ag.make_params(design)
    truth = study.truth_for(design, params)
    entries, tvs = [], {}
    for arm, seed, job in planned:
        result = study.evaluate_model(load_checkpoint(job.final), truth, design)
        entry = study.model_entry(arm, seed, result, truth)
        entry.update(checkpoint=job.final, losses=_losses(job.run_dir), draws=trained_draws(job.final))
        entries.append(entry)
        for name in study.WINDOW_TYPES:
            tvs.setdefault(arm, {}).setdefault(name, []).append(result[name]["tv"])
    tvs = {arm: {name: np.stack(v) for name, v in by.items()} for arm, by in tvs.items()}
    summary = study.summarise(design, entries, tvs, source_stats(design, params, Path(files.dir) / "stats.json"))
    summary.update(official=prereg is not None, preregistration=prereg, code=code, draws=draws, seeds=list(seeds),
                   steps=steps or config_steps(CONFIG), config=CONFIG,
                   seconds={"prepare_and_train": t1 - t0, "evaluate": time.perf_counter() - t1}, tvs=tvs)
    return summary


def argument_problem(args) -> str | None:
    """Why the command's arguments cannot run, or None: checked before any work."""
    least = {"--source-seed": (args.source_seed, 0), "--steps": (args.steps, 1), "--contexts": (args.contexts, 2),
             "--train-docs": (args.train_docs, 1), "--parallel": (args.parallel, 1)}
    for flag, (value, low) in least.items():
        if value is not None and value < low:
            return f"{flag} {value}: must be at least {low} (or leave it out for the registered value)"
    bad = [s for s in args.seeds if s < 0]
    if bad:
        return f"--seeds {' '.join(map(str, bad))}: training seeds are non-negative integers"
    if len(set(args.seeds)) != len(args.seeds):
        return f"--seeds {' '.join(map(str, args.seeds))} repeats a seed: give distinct seeds"
    return None


def design_from_args(args) -> ag.Design:
    changes = {k: v for k, v in (("source_seed", args.source_seed), ("contexts", args.contexts),
                                 ("train_docs", args.train_docs)) if v is not None}
    return dataclasses.replace(ag.Design(), **changes)
