"""The controlled experiment's runs (``eval/controlled.py``): the source written, the models trained
with ``train.py`` (cached per run), evaluated against the truth, and the theory-test sweep.

The source, the exact window chain and the scores are :mod:`rpt.studies.controlled.experiment`; the sweep's
summary is :mod:`rpt.studies.controlled.theory_prediction`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from rpt.cli.output_paths import output_problem
from rpt.cli.parser import report_input_error
from rpt.errors import InputError
from rpt.result_files import save_figure, sibling, write_json, write_markdown
from rpt.studies import owned_dirs
from rpt.studies.controlled import experiment as ctl
from rpt.studies.controlled import hmm as hmm_lib
from rpt.studies.controlled import theory_prediction as tt
from rpt.studies.controlled.source import Design, SourceFiles, write_source
from rpt.studies.sec3.errors import theory_curve
from rpt.training.measure.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[3]  # the repository: train.py and configs/ live there
DEFAULT_OUT = "runs/controlled/controlled.json"
PRETRAIN_CONFIG = "configs/controlled_pretrain.yaml"
FINETUNE_CONFIG = "configs/controlled_finetune.yaml"
SWEEP_CONFIG = "configs/controlled_sweep.yaml"
SWEEP_QS = (0.05, 0.1, 0.3, 0.6, 1.0)
SWEEP_OUT = "docs/theory_test.json"
OWNER = "controlled study"  # names the writer in rpt.studies.owned_dirs' markers and refusals


class TrainJob(NamedTuple):
    config: str
    run_dir: Path
    overrides: list[str]

    @property
    def final(self) -> str:
        return str(self.run_dir / "final")

    def cached(self) -> bool:
        meta = self.run_dir / "controlled_run.json"
        return (Path(self.final).is_dir() and meta.exists()
                and json.loads(meta.read_text()) == {"config": self.config, "overrides": self.overrides})


def run_jobs(jobs: list[TrainJob], parallel: int, owner: str = "controlled study") -> None:
    """``train.py --config C key=value...`` for each job not already done, ``parallel`` at a time
    (one torch thread each: a model this small trains faster as two 1-thread processes than as one
    2-thread process). Each run's console output goes to ``<run_dir>/console.log`` (its ``train.log`` is the trainer's own)."""
    todo = [j for j in jobs if not j.cached()]
    owned_dirs.check([j.run_dir for j in todo], owner, "delete")  # every run's directory, before the first starts
    for j in jobs:
        if j not in todo:
            print(f"[controlled] {j.run_dir}: cached", flush=True)
    env = dict(os.environ, OMP_NUM_THREADS="1") if parallel > 1 else dict(os.environ)
    running: list[tuple[TrainJob, subprocess.Popen, object]] = []
    failed = []

    def reap(block: bool) -> None:
        for item in list(running):
            job, proc, log = item
            if block or proc.poll() is not None:
                code = proc.wait()
                log.close()
                running.remove(item)
                if code != 0:
                    failed.append(f"{job.run_dir} (exit {code}; see {job.run_dir / 'console.log'})")
                else:
                    write_json(job.run_dir / "controlled_run.json", {"config": job.config, "overrides": job.overrides})
                    print(f"[controlled] {job.run_dir}: trained", flush=True)

    for job in todo:
        while len(running) >= parallel:
            time.sleep(0.2)
            reap(block=False)
        owned_dirs.fresh(job.run_dir, owner)  # only a directory the study wrote is emptied
        cmd = [sys.executable, "train.py", "--config", job.config, f"output_dir={job.run_dir}", "resume=none", *job.overrides]
        print("$ " + " ".join(cmd), flush=True)
        log = open(job.run_dir / "console.log", "w")
        running.append((job, subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    reap(block=True)
    if failed:
        raise SystemExit("error: training failed: " + "; ".join(failed))


def _losses(run_dir: Path) -> dict | None:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return None
    evals = [r for r in read_metrics(str(path)) if r.get("eval_ntp_loss") is not None]
    return {k: v for k, v in evals[-1].items() if k.startswith("eval_")} if evals else None


def _source_cached(files: SourceFiles, design: Design) -> bool:
    return (os.path.exists(files.hmm)
            and Design.from_dict(json.loads(Path(files.hmm).read_text())["design"]).source_dict() == design.source_dict())


def check_work(work: Path, design: Design, jobs: list[TrainJob]) -> None:
    """Every directory the study would delete or rewrite (the source when its design changed, the
    runs not yet trained) is its own or empty; raises ``ForeignDirectory`` before any work otherwise."""
    files = SourceFiles(str(work / "source"))
    doomed = [] if _source_cached(files, design) else [Path(files.dir)]
    owned_dirs.check([*doomed, *(j.run_dir for j in jobs if not j.cached())], OWNER, "delete")


def prepare_source(work: Path, design: Design) -> SourceFiles:
    files = SourceFiles(str(work / "source"))
    if _source_cached(files, design):
        print(f"[controlled] source {files.dir}: cached", flush=True)
        return files
    owned_dirs.fresh(files.dir, OWNER)  # with it the packed-data cache of older samples
    return write_source(files.dir, design)


def seed_jobs(work: Path, files: SourceFiles, seeds: list[int], pretrain_steps, finetune_steps,
              finetune_config: str = FINETUNE_CONFIG) -> tuple[dict[int, TrainJob], dict[int, TrainJob]]:
    """Per seed, the NTP pretraining job and the RPT fine-tune job from it."""
    data = [f"data={{path: {files.train}}}", f"val_data={{path: {files.validation}}}", f"cache_dir={files.dir}/cache"]
    pre = {s: TrainJob(PRETRAIN_CONFIG, work / f"pretrain_s{s}",
                       [f"tokenizer={files.tokenizer}", *data, f"seed={s}",
                        *([f"max_steps={pretrain_steps}"] if pretrain_steps else [])]) for s in seeds}
    # The default fine-tune's runs are rpt_s<seed>; another config's are named after it.
    name = "rpt" if finetune_config == FINETUNE_CONFIG else Path(finetune_config).stem
    rpt = {s: TrainJob(finetune_config, work / f"{name}_s{s}",
                       [f"init_from={pre[s].final}", "tokenizer=null", *data, f"seed={s}",
                        *([f"max_steps={finetune_steps}"] if finetune_steps else [])]) for s in seeds}
    return pre, rpt


def train_seeds(work: Path, files: SourceFiles, seeds: list[int], pretrain_steps, finetune_steps,
                parallel: int, finetune_config: str = FINETUNE_CONFIG) -> list[tuple[int, str, Path]]:
    """NTP pretraining, then the RPT fine-tune from it, per seed (seeds side by side)."""
    pre, rpt = seed_jobs(work, files, seeds, pretrain_steps, finetune_steps, finetune_config)
    owned_dirs.check([j.run_dir for j in (*pre.values(), *rpt.values()) if not j.cached()], OWNER, "delete")
    run_jobs(list(pre.values()), parallel)
    run_jobs(list(rpt.values()), parallel)
    return [(s, rpt[s].final, rpt[s].run_dir) for s in seeds]


def sweep_jobs(work: Path, files: SourceFiles, qs: list[float], seeds: list[int], steps: int | None,
               ntp_arm: bool) -> list[tuple[float | None, int, TrainJob]]:
    """One from-scratch run per (arm, seed); the pure-NTP arm is q = None (objective ntp)."""
    base = [f"tokenizer={files.tokenizer}", f"data={{path: {files.train}}}", f"val_data={{path: {files.validation}}}",
            f"cache_dir={files.dir}/cache", *([f"max_steps={steps}"] if steps else [])]
    arms = [(q, [f"q={q}"]) for q in qs] + ([(None, ["objective=ntp"])] if ntp_arm else [])
    return [(q, s, TrainJob(SWEEP_CONFIG, work / f"sweep_{'ntp' if q is None else f'q{q}'}_s{s}",
                            [*base, *extra, f"seed={s}"]))
            for s in seeds for q, extra in arms]  # seed-major: a cut-short sweep still has every arm once


def config_steps(config: str) -> int:
    import yaml

    return int(yaml.safe_load((ROOT / config).read_text())["max_steps"])


def run_sweep(args) -> dict:
    """Train (cached per run) and evaluate the sweep; returns the ``theory_test`` summary."""
    design = Design(contexts=args.contexts)
    work = Path(args.work).resolve()
    jobs = sweep_jobs(work, SourceFiles(str(work / "source")), args.qs, args.seeds, args.sweep_steps, not args.no_ntp_arm)
    check_work(work, design, [j for *_, j in jobs])
    files = prepare_source(work, design)
    hmm = hmm_lib.HMM.from_dict(json.loads(Path(files.hmm).read_text())["hmm"])
    truth = ctl.truth_for(hmm, design)
    cross = tt.crossovers(truth, design.theory_eps_n, seed=design.eval_seed)  # the truth alone
    run_jobs([j for *_, j in jobs], max(1, args.parallel))
    summary = tt.evaluate_arms(design, truth, [(q, s, j.final) for q, s, j in jobs], cross)
    for (_q, _s, job), arm in zip(jobs, summary["arms"]):
        arm["losses"] = _losses(job.run_dir)
    summary["design"] = {**design.to_dict(), "sweep_config": SWEEP_CONFIG, "qs": list(args.qs), "seeds": list(args.seeds),
                         "steps": args.sweep_steps or config_steps(SWEEP_CONFIG), "ntp_arm": not args.no_ntp_arm}
    return summary


def write_sweep(out: str, summary: dict) -> list[Path]:
    c = summary["confirms"]
    notes = (f"Pre-registered in docs/theory_test_preregistration.md. Spearman(r, TV1/TV0) = {summary['spearman']}; "
             f"signs agree {c['signs_agree']}/{c['signs_decided']} decided models; confirmed: {c['confirmed']}, "
             f"refuted: {c['refuted']}; practical: {summary.get('practical')}.")
    return [write_json(out, summary),
            write_markdown(sibling(out, ".md"), "Theory test: Sec. 3's crossover as a prediction", tt.markdown_tables(summary), notes),
            save_figure(tt.plot(summary), sibling(out, ".png"))]


def evaluate(design: Design, hmm: hmm_lib.HMM, runs: list[tuple[int, str, Path | None]]) -> dict:
    from rpt.sampling.loading import load_model, rpt_window_of  # late: transformers, for checkpoints

    truth = ctl.truth_for(hmm, design)
    evaluated = []
    for seed, checkpoint, run_dir in runs:
        window = rpt_window_of(checkpoint)
        if window is None:
            raise SystemExit(f"error: {checkpoint} is a plain causal LM, not an RPT checkpoint; the experiment needs one")
        model = load_model(checkpoint, window, "cpu", torch.float32)  # the sampler's one loader; trained in float32
        if model.window < design.window:
            raise SystemExit(f"error: {checkpoint} was trained with window {model.window}; the experiment needs {design.window}")
        result = ctl.evaluate_model(model, truth, design)
        result.update(seed=seed, checkpoint=checkpoint, losses=_losses(run_dir) if run_dir else None)
        evaluated.append(result)
    theory = {"eps_n": design.theory_eps_n,
              "curve": theory_curve(truth.cond, truth.joint, design.theory_eps_n, design.theory_ratios,
                                        design.iters, seed=design.eval_seed)}
    summary = ctl.summarise(design, evaluated, theory, ctl.source_stats(truth))
    val_docs = np.asarray(hmm_lib.sample(hmm, design.val_docs, design.doc_len, seed=design.hmm_seed + 2))
    # The best possible eval_ntp_loss of train.py on these documents: the source's own NLL of
    # x_2..x_T averaged over the T targets per row (the last target, EOS, costs ~0 once learned).
    summary["source"]["ideal_eval_ntp_loss"] = float(hmm_lib.token_nll(hmm, val_docs)[:, 1:].sum(axis=1).mean() / design.doc_len)
    return summary


def write_outputs(out: str, summary: dict, others: list[tuple[str, dict]] = ()) -> list[Path]:
    f = lambda x: f"{x:.4f}"  # noqa: E731
    ci = lambda c: f"[{c[0]:.4f}, {c[1]:.4f}]"  # noqa: E731
    rows = [[f"k = {k}" + (" (NTP)" if k == "0" else ""), f(v["mean"]), ci(v["ci95"])] for k, v in summary["k"].items()]
    if "stationary" in summary:
        rows.append(["k -> inf (stationary)", f(summary["stationary"]["mean"]), ci(summary["stationary"]["ci95"])])
    diffs = [[name, f(summary[name]["mean"]), ci(summary[name]["ci95"]), f(summary[name]["frac_contexts_improved"])]
             for name in summary if name.startswith("diff_") and isinstance(summary[name], dict)]
    seeds = [[r["seed"], *(f(r["k"][k]["mean"]) for k in summary["k"]), ci(r["diff_ci95"]),
              f(r["eps_ratios"]["prev_avg/next_avg"]) if "eps_ratios" in r else "",
              f(r["losses"]["eval_ntp_loss"]) if r.get("losses") else "",
              f(r["losses"].get("eval_ptp_loss_1") or float("nan")) if r.get("losses") else ""] for r in summary["per_seed"]]
    tables = [(["sampler", "mean TV to the truth", "95% CI"], rows),
              (["difference", "mean", "95% CI", "fraction of contexts improved"], diffs),
              (["seed", *(f"TV k={k}" for k in summary["k"]), "diff_1_0 95% CI", "eps_p/eps_n", "val NTP loss", "val PTP-1 loss"], seeds)]
    if "eps" in summary:
        e = summary["eps"]
        tables.append((["measure (TV, mean over contexts and seeds)", "NTP", "PTP"], [
            ["row-averaged conditional error (eps_{i+1|i}, eps_{i|i+1})", f(e["eps_next_avg"]), f(e["eps_prev_avg"])],
            ["max-norm (paper eq. 19)", f(e["eps_next_max"]), f(e["eps_prev_max"])],
            ["marginal error eps_i", f(e["eps_marginal"]), ""],
            ["KL(truth || model), nats", f"{e['kl_next']:.5f} (marginal {e['kl_marginal']:.5f})", f"{e['kl_prev']:.5f}"],
            ["true entropy, nats", f(e["entropy_next"]), f(e["entropy_prev"])],
        ]))
        tables.append((["eps_p / eps_n", "value"], [[k, f(v)] for k, v in summary["eps_ratios"].items()]
                       + [["kappa (mean)", f(e["kappa"])], ["RPT factor rho (eq. 18, mean)", f(e["rho"])]]))
    tables.append((["Sec. 3 noise model: eps_p/eps_n (weights)", "measured eps_p/eps_n", "TV k=0", "TV k=1",
                    "TV_1/TV_0", "fraction improved"],
                   [[t["eps_p/eps_n (noise weights)"], f(t["measured_ratio"]), f(t["tv_by_iters"]["0"]),
                     f(t["tv_by_iters"]["1"]), f(t["tv1_over_tv0"]), f(t["frac_improved"])]
                    for t in summary["theory"]["curve"]]))
    verdict = "reached" if summary["goal_reached"] else "not reached"
    notes = (f"{summary['metric']}. Goal ({summary['goal']}): **{verdict}**, difference "
             f"{summary['diff_1_0']['mean']:+.4f}, 95% CI {ci(summary['diff_ci95'])}. Source: {summary['source']}.")
    paths = [write_json(out, summary),
             write_markdown(sibling(out, ".md"), "Controlled experiment: RPT vs NTP sampling against a known truth", tables, notes),
             save_figure(ctl.plot(summary, others), sibling(out, ".png"))]
    return paths


def run_controlled(args: argparse.Namespace) -> int:
    """The whole experiment (or the sweep) for ``eval/controlled.py``'s parsed arguments; bad
    input is one ``error:`` line and 2."""
    if args.contexts < 2 or (args.checkpoints and not args.source) or (args.source and not args.checkpoints):
        print("error: need --contexts >= 2, and --source together with --checkpoints", file=sys.stderr)
        return 2
    steps = [s for s in (args.pretrain_steps, args.finetune_steps, args.sweep_steps) if s is not None]
    problem = output_problem(SWEEP_OUT if args.sweep and args.out == DEFAULT_OUT else args.out, "--out",
                             siblings=(".md", ".png"))
    work = Path(args.work)
    if problem is None and args.sweep and (work.exists() or work.is_symlink()) and not work.is_dir():
        problem = f"--work {work} is a file; name a directory for the sweep's source and runs"
    if problem is None and (args.parallel < 1 or (args.threads is not None and args.threads < 1) or min(steps, default=1) < 1):
        problem = "need --parallel >= 1, --threads >= 1 and step counts >= 1"
    if problem is not None:  # before a source is written or a model trained
        return report_input_error(InputError(problem), traceback_hint=False)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return _run_checked(args, others_of(args) if not args.sweep else [])
    except (owned_dirs.ForeignDirectory, _BadCompare) as e:
        return report_input_error(e, traceback_hint=False)


class _BadCompare(ValueError):
    pass


def others_of(args: argparse.Namespace) -> list[tuple[str, dict]]:
    """The ``--compare LABEL=F.json`` results."""
    others = []
    for item in args.compare:
        label, _, path = item.rpartition("=")
        if not Path(path).is_file():
            raise _BadCompare(f"--compare {item}: {path} not found")
        others.append((label or Path(path).stem, json.loads(Path(path).read_text())))
    return others


def _run_checked(args: argparse.Namespace, others: list[tuple[str, dict]]) -> int:
    if args.sweep:
        t0 = time.perf_counter()
        summary = run_sweep(args)
        summary["seconds"] = time.perf_counter() - t0
        out = SWEEP_OUT if args.out == DEFAULT_OUT else args.out
        paths = write_sweep(out, summary)
        print(Path(paths[1]).read_text(encoding="utf-8"))
        print("wrote " + ", ".join(str(p) for p in paths))
        return 0
    design = Design(contexts=args.contexts)
    t0 = time.perf_counter()
    if args.checkpoints:
        meta = json.loads(Path(SourceFiles(args.source).hmm).read_text())
        design = dataclasses.replace(Design.from_dict(meta["design"]), contexts=args.contexts)
        hmm = hmm_lib.HMM.from_dict(meta["hmm"])
        runs = [(i, c, None) for i, c in enumerate(args.checkpoints)]
    else:
        work = Path(args.out).resolve().parent
        pre, rpt = seed_jobs(work, SourceFiles(str(work / "source")), args.seeds, args.pretrain_steps,
                             args.finetune_steps, args.finetune_config)
        check_work(work, design, [*pre.values(), *rpt.values()])
        files = prepare_source(work, design)
        hmm = hmm_lib.HMM.from_dict(json.loads(Path(files.hmm).read_text())["hmm"])
        runs = train_seeds(work, files, args.seeds, args.pretrain_steps, args.finetune_steps, max(1, args.parallel),
                           args.finetune_config)
    t1 = time.perf_counter()
    summary = evaluate(design, hmm, runs)
    summary["seconds"] = {"prepare_and_train": t1 - t0, "evaluate": time.perf_counter() - t1}
    paths = write_outputs(args.out, summary, others)
    print(Path(paths[1]).read_text(encoding="utf-8"))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0

