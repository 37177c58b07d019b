"""``make demo``: the papers' protocol in miniature, on a CPU, with a model trained here.

    python -m rpt.demo [--out runs/demo] [--finetune-seeds 0 1] [--controlled-followup]

Stages (each cached in ``<out>/stages/<name>.json``; a rerun skips finished ones):

1. ``corpus``   -- the Python standard library of this interpreter, split by file; a BPE tokenizer.
2. ``ar_c``     -- pretrain a tiny Llama with NTP (the paper's AR-C).
3. ``ar_f`` / ``rpt`` -- from AR-C, continue NTP (AR-F) and, side by side, fine-tune with the RPT
   objective (configs/tiny_finetune.yaml: w = 2, s = 0.5, q = 0.15, lr 3e-3; AR-F gets the same lr),
   400 steps each, once per training seed (``--finetune-seeds``, default 0 and 1; the second
   seed's runs are ``ar_f_seed1`` / ``rpt_seed1``); every evaluation reads the whole validation split.
4. ``seed_study`` -- validation NTP loss of AR-F and of the RPT model, PTP-1 of the RPT model, and
   the differences (RPT - AR-F NTP, PTP-1 - NTP) with intervals over training seeds and over
   validation batches (rpt.studies.seed_study). Later stages evaluate the first seed's RPT model.
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
import sys
import time
from pathlib import Path

from rpt.demo.evaluation_stages import evaluations, run_eval, start_theory_test
from rpt.demo.report_json import build_report
from rpt.demo.stages import Stages, side_by_side
from rpt.demo.training_stages import (
    corpus_stage,
    fine_tune_commands,
    fine_tune_name,
    train_result,
    train_stage,
)
from rpt.studies import owned_dirs
from rpt.studies.seed_study import seed_study


def main(argv: list[str] | None = None) -> int:
    # prog: run as a package, argv[0] is .../rpt/demo/__main__.py; the usage line names the command instead.
    ap = argparse.ArgumentParser(prog="python -m rpt.demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
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
    for flag in ("pretrain_steps", "finetune_steps", "theory_steps", "error_positions", "repetition_prompts",
                 "repetition_tokens", "humaneval_limit", "precondition_positions"):
        if getattr(args, flag) < 1:  # 0 would fall back to a config's own count, or run nothing: refused
            ap.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be at least 1")
    out = Path(args.out)
    try:
        owned_dirs.claim(out, "demo")  # never writes into (or later rewrites) a directory of someone else's
    except owned_dirs.ForeignDirectory as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
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
        stages("corpus", lambda: corpus_stage(out))
        ar_c = stages("ar_c", lambda: train_stage(out, "ar_c", "configs/tiny_pretrain.yaml", args.pretrain_steps,
                                                  f"eval_every={args.pretrain_steps}", threads=1))
        theory = start_theory_test(out, stages, args)
        fine_tunes = fine_tune_commands(out, ar_c["final"], args.finetune_steps, args.finetune_seeds)
        side_by_side(stages, {name: (cmd, out / name / "console.log", lambda n=name: train_result(out / n, args.finetune_steps))
                              for name, cmd in fine_tunes.items()})
        stages("seed_study", lambda: seed_study({arm: [out / fine_tune_name(arm, s, args.finetune_seeds)
                                                       for s in args.finetune_seeds] for arm in ("ar_f", "rpt")},
                                                args.finetune_seeds))
        evaluations(out, stages, args, stages.results["rpt"]["final"])
        stages.finish("controlled", controlled)
        stages.finish("theory_test", theory)
    finally:
        for pending in (controlled, theory):
            if pending is not None:
                pending.stop()  # a no-op once it finished; ends it if another stage failed
    if args.controlled_followup:  # the pre-registered follow-up (10x PTP budget); ~2 more minutes
        stages("controlled_followup", lambda: run_eval(
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
