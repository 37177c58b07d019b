"""HumanEval+ / MBPP+ runs write EvalPlus's ``samples.jsonl``, and EvalPlus's OWN evaluator
(``evalplus.evaluate.evaluate``, in a fresh process) re-scores it to the pass@1 this project's
scorer reported, base and plus. A subset of tasks through EvalPlus's override of the problem file
(``HUMANEVAL_OVERRIDE_PATH`` / ``MBPP_OVERRIDE_PATH``), with hand-written right and wrong
completions and whole-program solutions (the chat format), so pass@1 is strictly between 0 and 1."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rpt.evaluation import evalplus_scoring as plus
from rpt.evaluation import samples_jsonl as samples
from tests.helpers.scripts import ROOT, load_script
from tests.helpers.train_helpers import free_port

pytestmark = pytest.mark.skipif(not (plus.data_dir() / plus.FILES["mbpp"]).is_file(),
                                reason=f"EvalPlus data not found at {plus.data_dir()}; set RPT_EVALPLUS_DIR")
pytest.importorskip("evalplus.evaluate")

HE_SOLUTION_6 = ("from typing import List\n\n\ndef parse_nested_parens(paren_string: str) -> List[int]:\n"
                 "    def depth(s):\n        d = m = 0\n        for ch in s:\n            d += 1 if ch == '(' else -1\n"
                 "            m = max(m, d)\n        return m\n    return [depth(s) for s in paren_string.split()]\n")
# Lines of the samples file we score: (task_id, fields). The solution lines are whole programs: EvalPlus
# runs them alone (no prompt), so the one without ``from typing import List`` fails in both scorers.
# Tasks with few inputs (69 and 50), so EvalPlus's and our expected outputs take seconds.
HUMANEVAL = [
    ("HumanEval/6", {"completion": "    return [len(s) // 2 for s in paren_string.split()]\n"}),
    ("HumanEval/6", {"solution": HE_SOLUTION_6}),
    ("HumanEval/6", {"solution": HE_SOLUTION_6.replace("from typing import List\n", "")}),
    ("HumanEval/55", {"completion": "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"}),
    ("HumanEval/55", {"completion": "    return n\n"}),
    ("HumanEval/55", {"completion": "    return {1: 1, 8: 21, 10: 55, 11: 89, 12: 144}[n]\n"}),  # the base inputs only
]
MBPP = [
    ("Mbpp/2", {"completion": "def similar_elements(a, b):\n    return tuple(sorted(set(a) & set(b), reverse=True))\n"}),
    ("Mbpp/2", {"completion": "def similar_elements(a, b):\n    return tuple(set(a))\n"}),
    ("Mbpp/3", {"solution": "def is_not_prime(n):\n    return n % 2 == 0\n"}),
    ("Mbpp/3", {"solution": "def is_not_prime(n):\n    return n in (1, 10, 35)\n"}),  # the base inputs only
    ("Mbpp/3", {"solution": "import math\ndef is_not_prime(n):\n    return n == 1 or any(n % i == 0 for i in "
                            "range(2, math.isqrt(n) + 1))\n"}),
]


def subset_data(folder: Path, dataset: str, task_ids: set[str]) -> Path:
    """The EvalPlus release file cut to ``task_ids`` (lines copied unchanged), under its own name."""
    source = plus.data_dir() / plus.FILES[dataset]
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / plus.FILES[dataset]
    with gzip.open(source, "rt", encoding="utf-8") as f:
        lines = [line for line in f if json.loads(line)["task_id"] in task_ids]
    assert len(lines) == len(task_ids)
    with gzip.open(target, "wt", encoding="utf-8") as f:
        f.writelines(lines)
    return target


# evalplus.evaluate.evaluate as its command line runs it; then exit at once: its watchdog thread
# (not a daemon) sleeps 20 s between looks and would keep the process alive that long after the end.
_EVALUATE = """
import os, sys
from evalplus.evaluate import evaluate
evaluate(dataset=sys.argv[1], samples=sys.argv[2], parallel=2, i_just_wanna_run=True)
sys.stdout.flush()
os._exit(0)
"""


def evalplus_pass_at_1(dataset: str, samples_file: Path, problem_file: Path, cache: Path) -> dict[str, float]:
    """``{"base": pass@1, "plus": pass@1}`` as ``evalplus.evaluate`` prints them."""
    env = {**os.environ, f"{dataset.upper()}_OVERRIDE_PATH": str(problem_file), "XDG_CACHE_HOME": str(cache),
           "NO_COLOR": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", _EVALUATE, dataset, str(samples_file)],
                          capture_output=True, text=True, timeout=600, cwd=samples_file.parent, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout)
    base = re.search(rf"^{dataset} \(base tests\)\s*\npass@1:\s*([0-9.]+)", text, re.MULTILINE)
    extra = re.search(rf"^{dataset}\+ \(base \+ extra tests\)\s*\npass@1:\s*([0-9.]+)", text, re.MULTILINE)
    assert base and extra, text[-2000:]
    return {"base": float(base.group(1)), "plus": float(extra.group(1))}


@pytest.mark.parametrize("dataset, script, extra, lines", [
    ("humaneval", "eval/humaneval.py", ["--plus"], HUMANEVAL),
    ("mbpp", "eval/mbpp.py", [], MBPP),
])
def test_evalplus_rescores_our_samples_to_the_same_pass_at_1(dataset, script, extra, lines, tmp_path, monkeypatch):
    monkeypatch.setenv("RPT_CACHE_DIR", str(tmp_path / "cache"))
    problem_file = subset_data(tmp_path / "data", dataset, {t for t, _ in lines})
    given = tmp_path / "given.jsonl"
    given.write_text("".join(json.dumps({"task_id": t, **fields}) + "\n" for t, fields in lines))
    out = tmp_path / "run" / f"{dataset}.json"
    argv = [*extra, "--completions", str(given), "--data-dir", str(problem_file.parent), "--out", str(out),
            "--workers", "2"]
    assert load_script(script).main(argv) == 0
    ours = json.loads(out.read_text())

    written = samples.samples_path(out)
    rows = [json.loads(line) for line in written.read_text().splitlines()]
    assert [(r["task_id"], {k: v for k, v in r.items() if k != "task_id" and v}) for r in rows] == lines
    assert 0.0 < ours["pass@1"] < ours["base"]["pass@1"] < 1.0  # right and wrong answers on both splits

    theirs = evalplus_pass_at_1(dataset, written, problem_file, tmp_path / "xdg")
    assert theirs["base"] == pytest.approx(ours["base"]["pass@1"], abs=5e-4)  # EvalPlus prints 3 decimals
    assert theirs["plus"] == pytest.approx(ours["pass@1"], abs=5e-4)


def test_a_generated_run_writes_one_samples_file_per_setting(tmp_path, monkeypatch):
    """``--checkpoint``: ``F.<setting>.samples.jsonl`` holds each setting's scored completions and
    ``F.samples.jsonl`` the first setting's (the JSON's top-level ``results``)."""
    from tests.helpers.eval_helpers import long_context_checkpoint

    monkeypatch.setenv("RPT_CACHE_DIR", str(tmp_path / "cache"))
    ckpt = long_context_checkpoint(tmp_path / "ckpt")
    out = tmp_path / "he.json"
    argv = ["--plus", "--checkpoint", ckpt, "--limit", "2", "--max-new-tokens", "6", "--rpt-iters", "0", "1",
            "--out", str(out), "--workers", "2"]
    assert load_script("eval/humaneval.py").main(argv) == 0
    summary = json.loads(out.read_text())
    first = [json.loads(line) for line in samples.samples_path(out).read_text().splitlines()]
    assert first == [{"task_id": r["task_id"], "completion": r["completion"]} for r in summary["results"]]
    for setting in summary["settings"]:
        path = samples.samples_path(out, setting["name"])
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert rows == [{"task_id": r["task_id"], "completion": r["completion"]} for r in setting["results"]]
        assert [r["task_id"] for r in rows] == ["HumanEval/0", "HumanEval/1"]


@pytest.mark.slow
def test_two_processes_write_the_single_process_samples_file(tmp_path, monkeypatch):
    """``accelerate launch`` with 2 CPU processes (under --chat, so lines carry solutions): the main
    process writes one samples file, the same as one process writes (about 40 s)."""
    pytest.importorskip("accelerate")
    from tests.helpers.chat_helpers import add_chat_template
    from tests.helpers.eval_helpers import long_context_checkpoint

    monkeypatch.setenv("RPT_CACHE_DIR", str(tmp_path / "cache"))
    ckpt = add_chat_template(long_context_checkpoint(tmp_path / "ckpt"))
    argv = ["--plus", "--checkpoint", ckpt, "--chat", "--limit", "3", "--max-new-tokens", "6", "--rpt-iters", "0", "1",
            "--workers", "2"]
    single = tmp_path / "single.json"
    assert load_script("eval/humaneval.py").main([*argv, "--out", str(single)]) == 0
    out = tmp_path / "ddp.json"
    accelerate = os.path.join(os.path.dirname(sys.executable), "accelerate")
    cmd = [accelerate, "launch", "--config_file", str(ROOT / "configs/accelerate/cpu_ddp.yaml"),
           "--main_process_port", str(free_port()), str(ROOT / "eval" / "humaneval.py"), *argv, "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE", HF_HUB_OFFLINE="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for setting in ("rpt0_t0", "rpt1_t0"):
        ours, ref = samples.samples_path(out, setting).read_text(), samples.samples_path(single, setting).read_text()
        assert ours == ref and len(ours.splitlines()) == 3 and '"solution"' in ours
