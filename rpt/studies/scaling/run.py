"""The scaling study's run (``eval/scaling.py``): the demo's corpus and tokenizer prepared once, every
(size, seed) model pretrained with NTP and fine-tuned with RPT (``train.py`` processes, one thread
each, cached per run), every fine-tuned model measured (cached per model), the summary and the
registered predictions written atomically.

The official seeds (``seeds`` of ``configs/scaling.yaml``) run only the registered protocol and only
when the pre-registration and the configs are, byte for byte, in a commit of this branch that
precedes any committed official result (:func:`rpt.studies.preregistration.check_before_result`); the registration
commits and the code's commit go into the results. Development uses other seeds.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rpt.result_files import save_figure, sibling, write_json, write_markdown
from rpt.studies.controlled.run import ROOT, TrainJob, run_jobs
from rpt.studies.preregistration import NotPreregistered, check_before_result, code_commit
from rpt.studies.scaling import report
from rpt.studies.scaling import summary as study
from rpt.studies.scaling.design import CONFIG, Design, Model, plan
from rpt.studies.scaling.measure import fixed_positions, measure, validation_docs

PREREGISTRATION = "docs/scaling_preregistration.md"
OFFICIAL_OUT = "docs/scaling.json"
DEFAULT_WORK = "runs/scaling"

__all__ = ["Refused", "run", "write_outputs", "is_official"]


class Refused(Exception):
    """A run the study will not do; the message is the one line to show."""


def protocol_files(design: Design) -> list[str]:
    return [PREREGISTRATION, CONFIG, design.pretrain_config, design.finetune_config]


def is_official(design: Design, seeds: Sequence[int]) -> bool:
    return any(s in design.seeds for s in seeds)


def check_official(design: Design, seeds: Sequence[int], changed: bool, root: Path) -> dict:
    """The registration record, or :class:`Refused` before any work."""
    fix = (f"commit {PREREGISTRATION} and the configs before the official run (and never change them after its "
           f"result), or develop with other --seeds than the official {' '.join(map(str, design.seeds))}")
    if list(seeds) != list(design.seeds) or changed:
        raise Refused(f"the official seeds ({' '.join(map(str, design.seeds))}) run the registered protocol only: "
                      "no --seeds subset and no development options; for development use other --seeds")
    try:
        return check_before_result(root, protocol_files(design), OFFICIAL_OUT, fix)
    except NotPreregistered as e:
        raise Refused(str(e)) from None


def prepare_corpus(design: Design, work: Path) -> str:
    """The demo's tokenizer (trained once on the corpus's training split with seed 0, as the demo's
    corpus stage does) and the packed token stores, built once before the runs that share them."""
    from rpt.data import build_packed, load_or_train_tokenizer  # late: datasets and the tokenizer stack
    from rpt.training.config import load_config  # late: with the data stack it checks against

    cfg = load_config(str(ROOT / design.pretrain_config))
    cfg = dataclasses.replace(cfg, cache_dir=str(work / "cache"), seed=0)
    tok = load_or_train_tokenizer(cfg.tokenizer, cfg.data, cfg.val_fraction, 0, cfg.cache_dir, None)
    cfg = dataclasses.replace(cfg, tokenizer=tok.name_or_path)
    build_packed(cfg, "train", tok)
    build_packed(cfg, "validation", tok)
    return tok.name_or_path


def train(models: Sequence[Model], parallel: int, runner: Callable[[list[TrainJob]], None] | None = None) -> None:
    """Every pretraining run, then every fine-tune, largest first (the long runs start first)."""
    order = sorted(models, key=lambda m: -m.size.parameters())
    for stage in ("pretrain", "finetune"):
        jobs = [getattr(m, stage) for m in order]
        todo = [j for j in jobs if not j.cached()]
        print(f"[scaling] {stage}: {len(jobs) - len(todo)} of {len(jobs)} runs done before; training {len(todo)}",
              flush=True)
        t0 = time.perf_counter()
        if runner is None:
            run_jobs(jobs, parallel)
        else:
            runner(todo)
        print(f"[scaling] {stage}: finished in {(time.perf_counter() - t0) / 60:.1f} min", flush=True)


def run(design: Design, seeds: Sequence[int], work: Path, parallel: int = 2, changed: bool = False,
        root: Path | None = None, runner: Callable[[list[TrainJob]], None] | None = None,
        tokenizer: str | None = None, extra_overrides: Sequence[str] = (), sizes: int | None = None,
        measure_threads: int | None = None) -> dict:
    """The whole study. ``changed``: the design differs from the registered one (development);
    ``sizes``: only the first ``sizes`` sizes, each trained as in the whole design (development);
    ``measure_threads``: torch threads of the measurement (None: torch's default);
    ``runner``, ``tokenizer`` and ``extra_overrides`` (appended to every training run) are for
    tests. Raises :class:`Refused` before any work when refused."""
    root = root or ROOT
    official = is_official(design, seeds)
    dev = changed or sizes is not None or bool(extra_overrides) or tokenizer is not None or runner is not None
    registration = check_official(design, seeds, dev, root) if official else None
    code = code_commit(root)  # the code this run starts with (later commits do not count)
    t0 = time.perf_counter()
    tokenizer = tokenizer or prepare_corpus(design, work)
    models = plan(design, seeds, work, tokenizer, sizes)
    if extra_overrides:
        models = [dataclasses.replace(m, pretrain=m.pretrain._replace(overrides=[*m.pretrain.overrides, *extra_overrides]),
                                      finetune=m.finetune._replace(overrides=[*m.finetune.overrides, *extra_overrides]))
                  for m in models]
    print(f"[scaling] {len(models)} models: " + ", ".join(
        f"{s.name} ({s.parameters():,} parameters, batch {design.batch(s)}, steps {'+'.join(map(str, design.steps(s)))})"
        for s in design.sizes[:sizes]) + f"; seeds {' '.join(map(str, seeds))}", flush=True)
    train(models, parallel, runner)
    t1 = time.perf_counter()
    measured = measure_all(design, models, work, tokenizer, parallel, measure_threads)
    summary = study.summarise(measured, design.bootstrap_resamples, design.predicted_crossover_log10)
    summary.update(study="scaling", official=registration is not None, registration=registration,
                   code=code, seeds=list(seeds), design=design.to_dict(),
                   models=[_model_row(m, design) for m in measured],
                   seconds={"prepare_and_train": t1 - t0, "measure_and_summarise": time.perf_counter() - t1})
    return summary


def _measure_one(job: tuple) -> dict:
    """One model measured in a worker process with ``threads`` torch threads (module level: picklable)."""
    threads, name, run_dir, out_dir, design, docs, positions, excess, extra = job
    if threads is not None:
        import torch  # late: only to set the worker's threads

        torch.set_num_threads(threads)
    return measure(name, run_dir, out_dir, design, docs, positions, excess, extra)


def measure_all(design: Design, models: Sequence[Model], work: Path, tokenizer: str, parallel: int = 1,
                threads: int | None = None) -> list[dict]:
    """Every model measured (or read back), ``parallel`` worker processes at a time (``threads``
    torch threads each; one process and torch's default threads when ``parallel`` is 1)."""
    from rpt.data.tokenizer import load_tokenizer  # late: the tokenizer stack

    docs = validation_docs(load_tokenizer(tokenizer))
    positions, excess = fixed_positions(docs, design)
    jobs = [(threads, m.name, m.finetune.run_dir, work / "measured", design, docs, positions, excess,
             {"size": m.size.name, "seed": m.seed, "parameters": m.size.parameters(),
              "training_tokens": design.training_tokens(m.size), "batch": design.batch(m.size),
              "steps": list(design.steps(m.size))}) for m in models]
    print(f"[scaling] measuring {len(jobs)} models, {parallel} at a time", flush=True)
    if parallel <= 1:
        return [_measure_one(j) for j in jobs]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawn: a fresh interpreter per worker (torch's thread pools do not survive a fork safely)
    with ProcessPoolExecutor(max_workers=parallel, mp_context=multiprocessing.get_context("spawn")) as pool:
        # Largest first (the longest measurements start first); results back in the models' order.
        order = sorted(range(len(jobs)), key=lambda i: -models[i].size.parameters())
        futures = {i: pool.submit(_measure_one, jobs[i]) for i in order}
        return [futures[i].result() for i in range(len(jobs))]


def _model_row(m: dict, design: Design) -> dict:
    """A model's row of the results (its per-position arrays stay in ``<work>/measured``)."""
    import numpy as np

    row = {k: m[k] for k in ("name", "size", "seed", "parameters", "training_tokens", "batch", "steps", "checkpoint")}
    row["ntp_loss"], row["ptp1_loss"] = m["losses"]["ntp"], m["losses"]["ptp_1"]
    row["ptp_excess"] = float(np.subtract(m["ptp_excess"]["head"], m["ptp_excess"]["implied"]).mean())
    row["eps_change"] = {r: float(np.subtract(v["p0"], v["p1"]).mean()) for r, v in m["error_analysis"].items()}
    row["estimator_bound"] = {r: float(np.mean(v["bound"])) for r, v in m["error_analysis"].items()}
    return row


def write_outputs(out: str | Path, summary: dict) -> list[Path]:
    return [write_json(out, summary),
            write_markdown(sibling(out, ".md"), "At what scale should RPT help on code? The scaling study",
                           report.tables(summary), report.notes(summary)),
            save_figure(report.plot(summary), sibling(out, ".png"))]
