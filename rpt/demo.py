"""``make demo``: the papers' protocol in miniature, on a CPU, with a model trained here.

    python -m rpt.demo [--out runs/demo] [--scale 1.0]

Stages (each cached in ``<out>/stages/<name>.json``; a rerun skips finished ones):

1. ``corpus``   -- the Python standard library of this interpreter, split by file; a BPE tokenizer.
2. ``ar_c``     -- pretrain a tiny Llama with NTP (the paper's AR-C).
3. ``ar_f`` / ``rpt`` -- from AR-C, continue NTP (AR-F) and, side by side, fine-tune with the RPT
   objective (configs/tiny_finetune.yaml: w = 2, s = 0.5, q = 0.15, lr 3e-3; AR-F gets the same lr),
   400 steps each, once per training seed (``--finetune-seeds``, default 0 and 1; the second
   seed's runs are ``ar_f_seed1`` / ``rpt_seed1``); every evaluation reads the whole validation split.
4. ``seed_study`` -- validation NTP loss of AR-F and of the RPT model, PTP-1 of the RPT model, and
   the differences (RPT - AR-F NTP, PTP-1 - NTP) with intervals over training seeds and over
   validation batches (rpt.studies.seeds). Later stages evaluate the first seed's RPT model.
5. ``error_analysis`` -- TV error after k = 0..3 RPT iterations on validation code (Table 2), with
   the paper's sampler (greedy PTP, confidence 0.9) and, beside it, eq. 4 with sampled PTP.
6. ``repetition`` -- degenerate-repetition rate, greedy: none / repetition / frequency / LZ / RPT+LZ.
7. ``humaneval`` -- a few HumanEval prompts, NTP vs RPT + LZ, scored in the sandbox.
8. ``controlled`` -- the controlled experiment (``eval/controlled.py``, docs/controlled_experiment.md):
   a small model trained here on a hidden Markov model whose joints are known exactly; total
   variation of its NTP (k = 0) and RPT (k = 1, 2) sampling laws to the truth, with intervals.
9. ``theory_test`` -- a subset of the theory-test sweep (docs/theory_test_preregistration.md):
   q in {0.1, 0.3, 1.0} and a pure-NTP arm, one seed, ``--theory-steps`` steps from scratch;
   crossovers from the truth, each model's eps_p / eps_n, TV_0, TV_1, predicted and observed sign.
10. ``report``  -- ``report.json`` and ``report.md`` with the tables and plots.

Every number in the report is read from the files the stages wrote; nothing is made up.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rpt.report import markdown_table, write_json
from rpt.studies.seeds import seed_study
from rpt.training.config import load_config
from rpt.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parent.parent


def _env(threads: int | None = None) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline", TOKENIZERS_PARALLELISM="false")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # sleeping, not spinning, OpenMP threads
    if threads is not None:
        # Decoding a tiny model is latency-bound: one thread is as fast and immune to contention.
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def _run(cmd: list[str], threads: int | None = None) -> None:
    print("$ " + " ".join(cmd), flush=True)
    res = subprocess.run(cmd, cwd=ROOT, env=_env(threads))
    if res.returncode != 0:
        raise SystemExit(f"demo stage failed (exit {res.returncode}): {' '.join(cmd)}")


class Background:
    """A stage run as a subprocess beside the following ones: a one-thread run on a 2-core machine
    leaves the second core to another (a tiny model gains little from a second thread). Its output
    goes to ``log_path``; ``wait`` returns ``collect()`` once it exited, and its own wall time."""

    def __init__(self, cmd: list[str], log_path: Path, collect, threads: int | None):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.cmd, self.collect, self.log_path = cmd, collect, log_path
        print("$ " + " ".join(cmd) + f"  (in the background, output in {self.log_path})", flush=True)
        self.t0 = time.perf_counter()
        self.log = open(self.log_path, "w")
        # Its own process group: if the demo stops early, stop() ends the run and its training children.
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(threads), stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        # The stage's wall time ends when the process does, not when the demo gets round to collecting it.
        self.seconds: float | None = None
        self.watcher = threading.Thread(target=self._watch, daemon=True)
        self.watcher.start()

    def _watch(self) -> None:
        self.proc.wait()
        self.seconds = time.perf_counter() - self.t0

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait()
        self.log.close()

    def wait(self) -> tuple[Any, float]:
        code = self.proc.wait()
        self.watcher.join()
        self.log.close()
        if code != 0:
            raise SystemExit(f"demo stage failed (exit {code}): {' '.join(self.cmd)}; see {self.log_path}")
        return self.collect(), self.seconds


class Stages:
    """Runs named stages once; results and wall times persist in ``<out>/stages``."""

    def __init__(self, out: Path):
        self.dir = out / "stages"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.results: dict[str, Any] = {}
        self.seconds: dict[str, float] = {}

    def _cached(self, name: str) -> bool:
        path = self.dir / f"{name}.json"
        if not path.exists():
            return False
        saved = json.loads(path.read_text())
        print(f"[demo] {name}: cached ({saved['seconds']:.0f} s when it ran)", flush=True)
        self.results[name], self.seconds[name] = saved["result"], saved["seconds"]
        return True

    def _save(self, name: str, result: Any, seconds: float) -> Any:
        write_json(self.dir / f"{name}.json", {"result": result, "seconds": seconds})
        self.results[name], self.seconds[name] = result, seconds
        return result

    def __call__(self, name: str, fn) -> Any:
        if self._cached(name):
            return self.results[name]
        print(f"\n[demo] ===== {name} =====", flush=True)
        t0 = time.perf_counter()
        result = fn()
        return self._save(name, result, time.perf_counter() - t0)

    def start(self, name: str, cmd: list[str], log_path: Path, collect, threads: int | None = None) -> Background | None:
        """Start stage ``name`` in the background unless it is cached; :meth:`finish` collects it."""
        if (self.dir / f"{name}.json").exists():
            return None
        print(f"\n[demo] ===== {name} (started in the background) =====", flush=True)
        return Background(cmd, log_path, collect, threads)

    def finish(self, name: str, pending: Background | None) -> Any:
        if pending is None and self._cached(name):
            return self.results[name]
        print(f"\n[demo] ===== {name}: waiting for the background run =====", flush=True)
        return self._save(name, *pending.wait())


# Every evaluation of a demo run reads the whole validation split (about 86 batches of 16 x 129
# tokens; the count is capped at what exists): the first 8 batches, the training default, are a
# few files whose losses sit almost 1 nat below the split's and swing by more than the 0.05-nat
# differences the report compares.
WHOLE_VALIDATION = "eval_batches=100000"


def _train_cmd(out: Path, name: str, config: str, steps: int, *overrides: str) -> list[str]:
    return [sys.executable, "train.py", "--config", config, f"output_dir={out / name}", f"max_steps={steps}",
            WHOLE_VALIDATION, *overrides]


def fine_tune_name(arm: str, seed: int, seeds: list[int]) -> str:
    """``ar_f`` / ``rpt`` for the first seed (the run every later stage evaluates), ``<arm>_seed<s>`` after."""
    return arm if seed == seeds[0] else f"{arm}_seed{seed}"


def fine_tune_commands(out: Path, ar_c: str, steps: int, seeds: list[int]) -> dict[str, list[str]]:
    """AR-F and the RPT fine-tune from AR-C, once per training seed (the arms of one seed share its
    data order, so their difference is paired)."""
    common = (f"init_from={ar_c}", "tokenizer=null", f"eval_every={steps}")
    commands = {}
    for seed in seeds:
        commands[fine_tune_name("ar_f", seed, seeds)] = _train_cmd(
            out, fine_tune_name("ar_f", seed, seeds), "configs/tiny_pretrain.yaml", steps, *common, f"seed={seed}",
            "lr=3e-3", "warmup_steps=20")  # = the fine-tune's lr and warm-up
        commands[fine_tune_name("rpt", seed, seeds)] = _train_cmd(
            out, fine_tune_name("rpt", seed, seeds), "configs/tiny_finetune.yaml", steps, *common, f"seed={seed}")
    return commands


def _train(out: Path, name: str, config: str, steps: int, *overrides: str, threads: int | None = None) -> dict:
    _run(_train_cmd(out, name, config, steps, *overrides), threads=threads)
    return _train_result(out / name, steps)


def _train_result(run_dir: Path, steps: int) -> dict:
    rows = read_metrics(str(run_dir / "metrics.jsonl"))
    evals = [r for r in rows if r.get("eval_ntp_loss") is not None]
    return {
        "final": str(run_dir / "final"),
        "steps": steps,
        "first_eval": evals[0] if evals else None,
        "last_eval": evals[-1] if evals else None,
        # Rows of an evaluation between logged steps carry no throughput.
        "tokens_per_s": (sum(r["tokens_per_s"] for r in logged) / len(logged)) if (logged := [r for r in rows if "tokens_per_s" in r]) else None,
        "loss_curves": str(run_dir / "loss_curves.png"),
    }


def _side_by_side(stages: Stages, runs: dict[str, tuple[list[str], Path, Any]]) -> None:
    """Run the uncached stages of ``runs`` (name -> command, log, collect) at once, one thread each."""
    pending = {name: stages.start(name, cmd, log, collect, threads=1) for name, (cmd, log, collect) in runs.items()}
    try:
        for name, run in pending.items():
            stages.finish(name, run)
    finally:
        for run in pending.values():
            if run is not None:
                run.stop()  # a no-op once it finished; ends the other if one failed


def _corpus(out: Path) -> dict:
    from rpt.data import (  # late: torch stays out of the demo's parent process
        build_packed,
        load_or_train_tokenizer,
        stdlib_files,
        stdlib_texts,
    )

    cfg = load_config(str(ROOT / "configs/tiny.yaml"))
    tok = load_or_train_tokenizer(cfg.tokenizer, cfg.data, cfg.val_fraction, cfg.seed, cfg.cache_dir, None)
    train, val = build_packed(cfg, "train", tok), build_packed(cfg, "validation", tok)
    return {
        "stdlib_files": len(stdlib_files()), "validation_files": len(stdlib_texts("validation", cfg.val_fraction)),
        "vocab_size": len(tok), "seq_len": cfg.seq_len,
        "train_tokens": len(train) * (cfg.seq_len + 1), "validation_tokens": len(val) * (cfg.seq_len + 1),
    }


def _eval(script: str, out_json: Path, *args: str) -> dict:
    _run([sys.executable, f"eval/{script}", *args, "--out", str(out_json)], threads=1)
    return json.loads(out_json.read_text())


def _intervals(summary: dict) -> dict:
    """Every interval an evaluation JSON carries (keys naming a CI / interval), for the report."""
    return {k: v for k, v in summary.items() if any(t in k.lower() for t in ("ci95", "interval", "_ci"))}


def controlled_summary(ce: dict) -> dict:
    """The report's ``controlled_experiment``: metric, direction, k -> mean and 95% CI, the
    interval of (k = 1) - (k = 0), and what Sec. 3 says explains the outcome."""
    return {
        "metric": ce["metric"],
        "lower_is_better": ce["lower_is_better"],
        "k": ce["k"],
        "diff_ci95": ce["diff_ci95"],
        "diff_mean": ce["diff_1_0"]["mean"],
        "tv_by_iters": ce["tv_by_iters"],
        "goal_reached": ce["goal_reached"],
        "eps_p_over_eps_n": ce.get("eps_ratios", {}).get("prev_avg/next_avg"),
        "kappa": ce.get("eps", {}).get("kappa"),
        "contexts": ce["contexts"],
        "seeds": ce["seeds"],
        "design": "docs/controlled_experiment.md",
    }


PROPER_KEYS = ("log_score_by_iters", "log_score_ci_by_iters", "brier_by_iters", "brier_ci_by_iters",
               "acceptance_by_eta", "precondition")


def proper_scores(ea: dict) -> dict:
    """Beside Table 2's improper 1 - p: the log and Brier scores by k, the acceptance rate of the
    first PTP step per eta, and (when run) the PTP head against the NTP-implied P*."""
    return {k: ea[k] for k in PROPER_KEYS if k in ea}


THEORY_ARM_KEYS = ("q", "seed", "ratio", "tv", "diff_ci95", "predicted_sign", "observed_sign", "tv1_over_tv0",
                   "shrunk_crossover", "scores", "acceptance", "precondition")


def theory_summary(tt: dict) -> dict:
    """The report's ``theory_test``: the sweep summary without its curves (they are in the plot)."""
    return {"crossover": tt["crossover"], "arms": [{k: a[k] for k in THEORY_ARM_KEYS if k in a} for a in tt["arms"]],
            "spearman": tt["spearman"], "ntp_arm_tv0": tt.get("ntp_arm_tv0"), "practical": tt.get("practical"),
            "confirms": tt.get("confirms"), "steps": tt.get("design", {}).get("steps"),
            "design": "docs/theory_test_preregistration.md"}


def build_report(out: Path, stages: Stages, args) -> dict:
    r = stages.results
    rpt_eval, arf_eval = r["rpt"]["last_eval"], r["ar_f"]["last_eval"]
    ea, rep = r["error_analysis"], r["repetition"]
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.python_implementation()} {platform.python_version()}",
        "corpus": r["corpus"],
        "steps": {"ar_c": r["ar_c"]["steps"], "ar_f": r["ar_f"]["steps"], "rpt": r["rpt"]["steps"]},
        "ntp_loss": rpt_eval["eval_ntp_loss"],
        "ar_f_ntp_loss": arf_eval["eval_ntp_loss"],
        "ar_c_ntp_loss": r["ar_c"]["last_eval"]["eval_ntp_loss"],
        "ptp_loss": [rpt_eval.get(f"eval_ptp_loss_{k}") for k in (1, 2)],  # PTP-2: None when w = 2
        "tv_by_iters": ea["tv_by_iters"],
        "frac_improved": ea["frac_improved"],
        "error_analysis_positions": ea["n_positions"],
        "error_analysis_estimator": ea.get("estimator"),
        "error_analysis_intervals": _intervals(ea),
        "error_analysis_ptp": ea.get("ptp", {}).get("label"),
        "error_analysis_verdict": ea.get("tv_change_1_0_verdict"),
        **({"sampled_ptp": {"tv_by_iters": r["error_analysis_sampled"]["tv_by_iters"],
                            "frac_improved": r["error_analysis_sampled"]["frac_improved"],
                            "intervals": _intervals(r["error_analysis_sampled"])}}
           if "error_analysis_sampled" in r else {}),
        "degenerate_rate": rep["degenerate_rate"],
        "repetition_settings": rep["settings"],
        "humaneval_pass@1": {name: res["pass@1"] for name, res in r["humaneval"].items()},
        "humaneval_problems": args.humaneval_limit,
        "error_analysis_proper_scores": proper_scores(ea),
        **({"sampled_ptp_proper_scores": proper_scores(r["error_analysis_sampled"])} if "error_analysis_sampled" in r else {}),
        **({"theory_test": theory_summary(r["theory_test"])} if "theory_test" in r else {}),
        **({"seed_study": r["seed_study"]} if "seed_study" in r else {}),
        "controlled_experiment": controlled_summary(r["controlled"]),
        **({"controlled_followup": controlled_summary(r["controlled_followup"])} if "controlled_followup" in r else {}),
        "stage_seconds": stages.seconds,
        "total_seconds": sum(stages.seconds.values()),
        # The wall time of the invocation that wrote this report (cached stages cost ~0 here;
        # stages run two at a time, so this is below the sum above).
        "wall_seconds": getattr(args, "wall_seconds", None),
    }
    write_json(out / "report.json", report)
    (out / "report.md").write_text(render_markdown(report, out))
    return report


def render_markdown(rep: dict, out: Path) -> str:
    f = lambda x: f"{x:.4f}" if isinstance(x, float) else ("" if x is None else str(x))  # noqa: E731
    lines = [
        "# RPT demo report", "",
        f"Machine: {rep['machine']}. Stage wall times add up to {rep['total_seconds'] / 60:.1f} min"
        + (f"; this invocation took {rep['wall_seconds'] / 60:.1f} min (stages run two at a time, one "
           "thread each). " if rep.get("wall_seconds") else ". ") +
        f"Corpus: {rep['corpus']['stdlib_files']} stdlib files ({rep['corpus']['train_tokens']:,} train / "
        f"{rep['corpus']['validation_tokens']:,} validation tokens), BPE vocabulary {rep['corpus']['vocab_size']}.", "",
        "## Validation losses (nats/token; the paper's Fig. 5 and its \"NTP barely changes\" claim)", "",
        markdown_table(["model", "steps", "NTP", "PTP-1", "PTP-2"], [
            ["AR-C (pretrained, NTP)", rep["steps"]["ar_c"], f(rep["ar_c_ntp_loss"]), "", ""],
            ["AR-F (AR-C + more NTP)", rep["steps"]["ar_c"] + rep["steps"]["ar_f"], f(rep["ar_f_ntp_loss"]), "", ""],
            ["RPT (AR-C + RPT fine-tune)", rep["steps"]["ar_c"] + rep["steps"]["rpt"], f(rep["ntp_loss"]),
             f(rep["ptp_loss"][0]), f(rep["ptp_loss"][1])],
        ]),
        *(_seed_markdown(rep["seed_study"], rep["steps"]["rpt"]) if "seed_study" in rep else []),
        "![RPT fine-tune losses](rpt/loss_curves.png)", "",
        f"## Error analysis (Table 2): mean TV error 1 - p_k(x_i) after k RPT iterations (w = 2), "
        f"{rep['error_analysis_positions']} validation positions, estimator: {rep['error_analysis_estimator']}", "",
        markdown_table(["PTP step", *rep["tv_by_iters"].keys()],
                       [[rep.get("error_analysis_ptp") or "", *[f(v) for v in rep["tv_by_iters"].values()]]]
                       + ([["sampled PTP (eq. 4 as written)", *[f(v) for v in rep["sampled_ptp"]["tv_by_iters"].values()]]]
                          if rep.get("sampled_ptp") else [])),
        f"Fraction of positions where p_1 > p_0: {f(rep['frac_improved'])}"
        + (f" ({f(rep['sampled_ptp']['frac_improved'])} with sampled PTP)" if rep.get("sampled_ptp") else "") + ".", "",
        *([f"Verdict: {rep['error_analysis_verdict']}.", ""] if rep.get("error_analysis_verdict") else []),
        *([f"Intervals (from the error analysis): `{json.dumps(rep['error_analysis_intervals'])}`", ""]
          if rep.get("error_analysis_intervals") else []),
        "![error analysis](error_analysis.png)", "",
        "## Degenerate repetition, greedy decoding (LZ paper Fig. 2)", "",
        "Repetition / frequency: the best rate over each sweep; all settings below.", "",
        markdown_table(["sampler", "degenerate rate"], [[k, f(v)] for k, v in rep["degenerate_rate"].items()]),
        markdown_table(["setting", "degenerate rate", "log-likelihood (nats/token)", "mean new tokens"],
                       [[s["setting"], f(s["degenerate_rate"]), f(s["mean_loglik"]), f(s["mean_new_tokens"])]
                        for s in rep["repetition_settings"]]),
        "![repetition](repetition.png)", "",
        f"## HumanEval, first {rep['humaneval_problems']} problems, greedy (a model this small scores ~0; shown as measured)", "",
        markdown_table(["sampler", "pass@1"], [[k, f(v)] for k, v in rep["humaneval_pass@1"].items()]),
        *_proper_markdown(rep),
        *(_theory_markdown(rep["theory_test"]) if "theory_test" in rep else []),
        *_controlled_markdown(rep["controlled_experiment"]),
        *(_controlled_markdown(rep["controlled_followup"], "the follow-up with a 10x PTP budget", "followup")
          if "controlled_followup" in rep else []),
        "## Wall time per stage (s)", "",
        markdown_table(list(rep["stage_seconds"]), [[f"{v:.0f}" for v in rep["stage_seconds"].values()]]),
    ]
    return "\n".join(lines) + "\n"


def _seed_markdown(study: dict, steps: int) -> list[str]:
    f = lambda x: "" if x is None else f"{x:+.4f}"  # noqa: E731
    ci = lambda c: "" if c is None else f"[{c[0]:+.4f}, {c[1]:+.4f}]"  # noqa: E731
    rows = [[what, ", ".join(f(d) for d in c["per_seed"]), f(c["mean"]), ci(c["ci95_seeds"]), ci(c["ci95_batches"]),
             c["observed_sign"]] for what, c in (("RPT NTP - AR-F NTP", study["ntp_gap"]),
                                                  ("RPT PTP-1 - RPT NTP", study["ptp1_minus_ntp"]))]
    return [f"Over training seeds {', '.join(map(str, study['seeds']))} ({steps} fine-tune steps each; the table "
            "above is the first seed's; rpt.studies.seeds says how each interval is made):", "",
            markdown_table(["difference (nats/token)", "per seed", "mean", "95% CI over seeds (t)",
                            "95% CI over validation batches", "observed sign"], rows)]


def _proper_markdown(rep: dict) -> list[str]:
    """Log / Brier scores by k and acceptance per eta for each error analysis that has them."""
    f = lambda x: "" if x is None else f"{x:.4f}"  # noqa: E731
    rows, acc, pre = [], [], []
    for label, key in ((rep.get("error_analysis_ptp") or "headline", "error_analysis_proper_scores"),
                       ("sampled PTP", "sampled_ptp_proper_scores")):
        ps = rep.get(key) or {}
        if "brier_by_iters" in ps:
            rows += [[label, "log score", *map(f, ps["log_score_by_iters"].values())],
                     [label, "Brier score", *map(f, ps["brier_by_iters"].values())]]
        if "acceptance_by_eta" in ps:
            acc.append([label, *map(f, ps["acceptance_by_eta"].values())])
        if "precondition" in ps:
            pc = ps["precondition"]
            pre.append(f"Precondition ({pc['n_positions']} positions, exact): PTP head loss {pc['ptp_head_loss']:.4f} vs "
                       f"the NTP-implied P* {pc['ntp_implied_loss']:.4f} nats (difference {pc['difference']:+.4f}, 95% CI "
                       f"[{pc['difference_ci'][0]:+.4f}, {pc['difference_ci'][1]:+.4f}]).")
    if not rows:
        return []
    etas = list((rep.get("error_analysis_proper_scores") or {}).get("acceptance_by_eta", {}))
    ks = list(rep["tv_by_iters"])
    return ["## Proper scores beside Table 2 (1 - p rewards the mode; log and Brier do not), lower is better", "",
            markdown_table(["PTP step", "score", *(f"k = {k}" for k in ks)], rows),
            *([markdown_table(["PTP step", *(f"accepted, eta = {e}" for e in etas)], acc)] if acc else []),
            *[line + "\n" for line in pre]]


def _theory_markdown(tt: dict) -> list[str]:
    f = lambda x: "" if x is None else f"{x:.4f}"  # noqa: E731
    rows = [["NTP arm" if a["q"] is None else a["q"], a["seed"], f(a["ratio"]), f(a["tv"]["0"]), f(a["tv"]["1"]),
             f"[{a['diff_ci95'][0]:+.4f}, {a['diff_ci95'][1]:+.4f}]", a["predicted_sign"], a["observed_sign"]]
            for a in tt["arms"]]
    c = tt["crossover"]
    return [f"## Theory test (subset of the pre-registered sweep, {tt['design']}; {tt.get('steps')} steps)", "",
            f"Crossovers from the truth alone (eps_p / eps_n, measured units): noise model {f(c['noise_model'])}, "
            f"shared noise {f(c['shared_noise'])}, Theorem 1 (max-norm) {f(c['theorem1'])}. Predicted sign: -1 "
            f"(RPT closer) below the noise model's r*.", "",
            markdown_table(["q", "seed", "eps_p/eps_n", "TV0", "TV1", "TV1-TV0 95% CI", "predicted", "observed"], rows),
            f"Spearman(r, TV1/TV0): {tt['spearman']}; pure-NTP arm TV0: {f(tt.get('ntp_arm_tv0'))}; "
            f"practical: {tt.get('practical')}.", "", "![theory test](theory_test/theory_test.png)", ""]


def _controlled_markdown(ce: dict, what: str = "a source with a known truth", name: str = "controlled") -> list[str]:
    ci = lambda c: f"[{c[0]:.4f}, {c[1]:.4f}]"  # noqa: E731
    verdict = "yes" if ce["goal_reached"] else "no"
    return [
        f"## Controlled experiment: {what} ({ce['design']})", "",
        f"Metric: {ce['metric']} (lower is better).", "",
        markdown_table(["k", "mean TV", "95% CI"],
                       [[k + (" (NTP)" if k == "0" else ""), f"{v['mean']:.4f}", ci(v["ci95"])] for k, v in ce["k"].items()]),
        f"(k = 1) - (k = 0): {ce['diff_mean']:+.4f}, 95% CI {ci(ce['diff_ci95'])}. RPT closer to the truth with "
        f"the interval excluding zero: **{verdict}**. Learned eps_p / eps_n = {ce['eps_p_over_eps_n']:.2f} "
        f"(Sec. 3: RPT gains when it is small enough; kappa = {ce['kappa']:.2f}).", "",
        f"![controlled experiment](controlled/{name}.png)", "",
    ]


def _evaluations(out: Path, stages: Stages, args, rpt_ckpt: str) -> None:
    """Error analysis, repetition and HumanEval on the RPT model (one thread each; the repetition
    study beside the others)."""
    rep_json = out / "repetition.json"
    repetition = stages.start("repetition", [sys.executable, "eval/repetition.py", "--checkpoint", rpt_ckpt,
                                             "--limit", str(args.repetition_prompts),
                                             "--max-new-tokens", str(args.repetition_tokens), "--batch-size", "16",
                                             "--out", str(rep_json)],
                              rep_json.with_suffix(".log"), lambda: json.loads(rep_json.read_text()), threads=1)
    try:
        _evaluations_in_front(out, stages, args, rpt_ckpt)
        stages.finish("repetition", repetition)
    finally:
        if repetition is not None:
            repetition.stop()


def _evaluations_in_front(out: Path, stages: Stages, args, rpt_ckpt: str) -> None:
    common_ea = ["--checkpoint", rpt_ckpt, "--limit", str(args.error_positions)]
    # The headline chain is the sampler the paper's results use (and sample.py's default): greedy
    # PTP accepted above confidence 0.9 (Sec. 5.1); eq. 4 with sampled PTP is reported beside it.
    stages("error_analysis", lambda: _eval("error_analysis.py", out / "error_analysis.json", *common_ea,
                                           "--ptp", "greedy", "--confidence", "0.9"))
    stages("error_analysis_sampled", lambda: _eval("error_analysis.py", out / "error_analysis_sampled.json", *common_ea,
                                                   "--ptp", "sampled", "--precondition", str(args.precondition_positions)))

    def humaneval() -> dict:
        common_he = ["--checkpoint", rpt_ckpt, "--limit", str(args.humaneval_limit), "--max-new-tokens", "128"]
        ntp = _eval("humaneval.py", out / "humaneval_ntp.json", *common_he, "--rpt-iters", "0")
        rpt = _eval("humaneval.py", out / "humaneval_rpt_lz.json", *common_he, "--rpt-iters", "1", "--lz-penalty", "0.15")
        return {"ntp": {"pass@1": ntp["pass@1"]}, "rpt_k1_lz": {"pass@1": rpt["pass@1"]}}

    stages("humaneval", humaneval)


THEORY_QS = ("0.1", "0.3", "1.0")


def _start_theory_test(out: Path, stages: Stages, args):
    """The theory-test subset in the background (one thread, runs after one another), beside the
    fine-tunes; its own source directory, so it never races the controlled stage's."""
    tt_json = out / "theory_test" / "theory_test.json"
    cmd = [sys.executable, "eval/controlled.py", "--sweep", "--parallel", "1", "--qs", *THEORY_QS, "--seeds", "0",
           "--sweep-steps", str(args.theory_steps), "--work", str(out / "theory_test"), "--out", str(tt_json)]
    tt_json.parent.mkdir(parents=True, exist_ok=True)
    return stages.start("theory_test", cmd, tt_json.with_suffix(".log"), lambda: json.loads(tt_json.read_text()), threads=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/demo")
    ap.add_argument("--pretrain-steps", type=int, default=400)
    ap.add_argument("--finetune-steps", type=int, default=400)
    ap.add_argument("--finetune-seeds", type=int, nargs="+", default=[0, 1],
                    help="training seeds of AR-F and the RPT fine-tune (intervals over seeds need >= 2; "
                         "later stages evaluate the first seed's RPT model)")
    ap.add_argument("--error-positions", type=int, default=2000)
    ap.add_argument("--repetition-prompts", type=int, default=32)
    ap.add_argument("--repetition-tokens", type=int, default=192)
    ap.add_argument("--humaneval-limit", type=int, default=8)
    ap.add_argument("--precondition-positions", type=int, default=100,
                    help="positions of the exact PTP-head vs NTP-implied comparison (V NTP queries each)")
    ap.add_argument("--theory-steps", type=int, default=600, help="training steps per theory-test arm")
    ap.add_argument("--controlled-followup", action="store_true",
                    help="also run the controlled experiment's follow-up (docs/controlled_experiment.md)")
    args = ap.parse_args(argv)
    if len(set(args.finetune_seeds)) != len(args.finetune_seeds):
        ap.error(f"--finetune-seeds {' '.join(map(str, args.finetune_seeds))} repeats a seed: give distinct seeds")
    out = Path(args.out)
    stages = Stages(out)
    t0 = time.perf_counter()

    # The schedule keeps both cores busy with one-thread processes (a model this small gains
    # little from a second thread): the controlled experiment, which needs nothing else, runs
    # beside the corpus and AR-C; the fine-tunes of every seed (AR-F and RPT) and the theory test
    # together; the repetition study beside the other evaluations.
    controlled_json = out / "controlled" / "controlled.json"
    controlled = stages.start("controlled", [sys.executable, "eval/controlled.py", "--parallel", "1",
                                             "--out", str(controlled_json)],
                              controlled_json.with_suffix(".log"), lambda: json.loads(controlled_json.read_text()),
                              threads=1)
    theory = None  # started after AR-C, beside the fine-tunes
    try:
        stages("corpus", lambda: _corpus(out))
        ar_c = stages("ar_c", lambda: _train(out, "ar_c", "configs/tiny_pretrain.yaml", args.pretrain_steps,
                                             f"eval_every={args.pretrain_steps}", threads=1))
        theory = _start_theory_test(out, stages, args)
        fine_tunes = fine_tune_commands(out, ar_c["final"], args.finetune_steps, args.finetune_seeds)
        _side_by_side(stages, {name: (cmd, out / name / "console.log", lambda n=name: _train_result(out / n, args.finetune_steps))
                               for name, cmd in fine_tunes.items()})
        stages("seed_study", lambda: seed_study({arm: [out / fine_tune_name(arm, s, args.finetune_seeds)
                                                       for s in args.finetune_seeds] for arm in ("ar_f", "rpt")},
                                                args.finetune_seeds))
        _evaluations(out, stages, args, stages.results["rpt"]["final"])
        stages.finish("controlled", controlled)
        stages.finish("theory_test", theory)
    finally:
        for pending in (controlled, theory):
            if pending is not None:
                pending.stop()  # a no-op once it finished; ends it if another stage failed
    if args.controlled_followup:  # the pre-registered follow-up (10x PTP budget); ~2 more minutes
        stages("controlled_followup", lambda: _eval(
            "controlled.py", out / "controlled" / "followup.json",
            "--finetune-config", "configs/controlled_finetune_ptp_rich.yaml",
            "--compare", f"primary design={out / 'controlled' / 'controlled.json'}"))
    args.wall_seconds = time.perf_counter() - t0
    report = build_report(out, stages, args)
    print(f"\n[demo] done in {(time.perf_counter() - t0) / 60:.1f} min (stage total {report['total_seconds'] / 60:.1f} min; "
          "stages run two at a time)")
    print(f"[demo] NTP loss: AR-F {report['ar_f_ntp_loss']:.4f}, RPT {report['ntp_loss']:.4f}; "
          f"PTP-1 {report['ptp_loss'][0]:.4f}, PTP-2 {report['ptp_loss'][1]}")
    print(f"[demo] TV error by k ({report['error_analysis_ptp']}): "
          + ", ".join(f"{k}: {v:.4f}" for k, v in report["tv_by_iters"].items())
          + f"; p_1 > p_0 at {report['frac_improved']:.3f} of positions")
    print("[demo] degenerate rate: " + ", ".join(f"{k} {v:.3f}" for k, v in report["degenerate_rate"].items()))
    ce = report["controlled_experiment"]
    print("[demo] controlled experiment, TV to the truth by k: " + ", ".join(f"{k}: {v['mean']:.4f}" for k, v in ce["k"].items())
          + f"; (k=1)-(k=0) 95% CI [{ce['diff_ci95'][0]:+.4f}, {ce['diff_ci95'][1]:+.4f}]")
    print("[demo] HumanEval pass@1: " + ", ".join(f"{k} {v:.3f}" for k, v in report["humaneval_pass@1"].items()))
    print(f"[demo] wrote {out / 'report.json'} and {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
