"""The demo's evaluation stages on the RPT model: the error analysis (greedy and sampled PTP), the
repetition study beside them, a few HumanEval problems, and the theory-test subset started in the
background beside the fine-tunes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rpt.demo.processes import run_command
from rpt.demo.stages import Stages


def run_eval(script: str, out_json: Path, *args: str) -> dict:
    run_command([sys.executable, f"eval/{script}", *args, "--out", str(out_json)], threads=1)
    return json.loads(out_json.read_text())


def evaluations(out: Path, stages: Stages, args, rpt_ckpt: str) -> None:
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
    stages("error_analysis", lambda: run_eval("error_analysis.py", out / "error_analysis.json", *common_ea,
                                              "--ptp", "greedy", "--confidence", "0.9"))
    stages("error_analysis_sampled", lambda: run_eval("error_analysis.py", out / "error_analysis_sampled.json", *common_ea,
                                                      "--ptp", "sampled", "--precondition", str(args.precondition_positions)))

    def humaneval() -> dict:
        common_he = ["--checkpoint", rpt_ckpt, "--limit", str(args.humaneval_limit), "--max-new-tokens", "128"]
        ntp = run_eval("humaneval.py", out / "humaneval_ntp.json", *common_he, "--rpt-iters", "0")
        rpt = run_eval("humaneval.py", out / "humaneval_rpt_lz.json", *common_he, "--rpt-iters", "1", "--lz-penalty", "0.15")
        return {"ntp": {"pass@1": ntp["pass@1"]}, "rpt_k1_lz": {"pass@1": rpt["pass@1"]}}

    stages("humaneval", humaneval)


THEORY_QS = ("0.1", "0.3", "1.0")


def start_theory_test(out: Path, stages: Stages, args):
    """The theory-test subset in the background (one thread, runs after one another), beside the
    fine-tunes; its own source directory, so it never races the controlled stage's."""
    tt_json = out / "theory_test" / "theory_test.json"
    cmd = [sys.executable, "eval/controlled.py", "--sweep", "--parallel", "1", "--qs", *THEORY_QS, "--seeds", "0",
           "--sweep-steps", str(args.theory_steps), "--work", str(out / "theory_test"), "--out", str(tt_json)]
    tt_json.parent.mkdir(parents=True, exist_ok=True)
    return stages.start("theory_test", cmd, tt_json.with_suffix(".log"), lambda: json.loads(tt_json.read_text()), threads=1)
