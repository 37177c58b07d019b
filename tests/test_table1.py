"""Table 1 in one command: every benchmark and window runs, the table is assembled from their files,
a rerun reuses everything, and the relative changes are right on a hand-made example."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rpt.evaluation import plus, table1
from tests.eval_helpers import gsm8k_folder, long_context_checkpoint
from tests.scripts import load_script

needs_evalplus = pytest.mark.skipif(not (plus.data_dir() / plus.FILES["mbpp"]).is_file(),
                                    reason=f"EvalPlus data not found at {plus.data_dir()}; set RPT_EVALPLUS_DIR")


def test_plan_measures_ntp_once():
    runs = table1.plan([2, 3], [0, 1, 2], ["humaneval_plus", "gsm8k"])
    assert [(r.benchmark, r.window, r.iters) for r in runs] == [
        ("humaneval_plus", 2, (0, 1, 2)), ("gsm8k", 2, (0, 1, 2)), ("humaneval_plus", 3, (1, 2)), ("gsm8k", 3, (1, 2))]


def test_rows_best_of_temperatures_and_relative_change():
    def summary(metric: str, best: dict[str, tuple[float, float]]) -> dict:
        return {"best_of_temperatures": {k: {"rpt_iters": int(k), "temperature": t, metric: v}
                                         for k, (v, t) in best.items()}}

    outputs = {
        table1.Run("humaneval_plus", 2, (0, 1)): summary("pass@1", {"0": (0.40, 0.0), "1": (0.50, 0.05)}),
        table1.Run("gsm8k", 2, (0, 1)): summary("accuracy", {"0": (0.0, 0.0), "1": (0.25, 0.1)}),
        table1.Run("humaneval_plus", 3, (1,)): summary("pass@1", {"1": (0.30, 0.1)}),
    }
    rows = table1.rows_from(outputs)
    assert [(r["window"], r["rpt_iters"]) for r in rows] == [(None, 0), (2, 1), (3, 1)]
    ntp, w2, w3 = rows
    assert w2["HumanEval+"] == {"score": 0.5, "temperature": 0.05, "change": pytest.approx(0.1),
                                "relative_change": pytest.approx(0.25)}
    assert w3["HumanEval+"]["relative_change"] == pytest.approx(-0.25)
    assert w2["GSM8K"]["relative_change"] is None and w2["GSM8K"]["change"] == 0.25  # NTP scored 0
    headers, body = table1.markdown_rows(rows)
    assert body[1][3] == "50.0 (+25.0%)" and body[2][3] == "30.0 (-25.0%)" and body[1][5] == "25.0 (+25.0 pt)"
    assert "MBPP+" not in w2 and body[0][:3] == ["NTP", "", 0]


@needs_evalplus
def test_table1_runs_end_to_end_and_resumes(tmp_path, monkeypatch):
    ckpt = long_context_checkpoint(tmp_path / "ckpt")
    data = gsm8k_folder(tmp_path / "gsm8k")
    out = tmp_path / "table1"
    argv = ["--checkpoint", ckpt, "--out", str(out), "--limit", "1", "--max-new-tokens", "8", "--temperatures", "0",
            "0.1", "--shots", "1", "--gsm8k-data", str(data / "test.jsonl")]
    script = load_script("eval/table1.py")
    assert script.main(argv) == 0
    table = json.loads((out / "table1.json").read_text())
    assert [(r["window"], r["rpt_iters"]) for r in table["rows"]] == [(None, 0), (2, 1), (2, 2), (3, 1), (3, 2)]
    for row in table["rows"]:
        for column in ("HumanEval+", "MBPP+", "GSM8K"):
            assert 0.0 <= row[column]["score"] <= 1.0 and row[column]["temperature"] in (0.0, 0.1)
    for benchmark in ("humaneval_plus", "mbpp_plus", "gsm8k"):
        for w in (2, 3):
            summary = json.loads((out / f"{benchmark}_w{w}.json").read_text())
            assert [s["rpt_window"] for s in [summary["sampling"]]] == [w]
            assert {s["rpt_iters"] for s in summary["settings"]} == ({0, 1, 2} if w == 2 else {1, 2})
    he = json.loads((out / "humaneval_plus_w2.json").read_text())
    assert {"pass@1", "base", "plus", "n_problems"} <= set(he) and he["n_problems"] == 1
    assert "| RPT | 3 | 2 |" in (out / "table1.md").read_text()
    assert (out / "table1.png").read_bytes()[:4] == b"\x89PNG"

    stores = {p: p.read_bytes() for p in Path(out).glob("*.items.jsonl")}
    assert len(stores) == 6
    assert script.main(argv) == 0  # resumed: nothing generated or executed again
    assert {p: p.read_bytes() for p in Path(out).glob("*.items.jsonl")} == stores
    assert json.loads((out / "table1.json").read_text())["rows"] == table["rows"]
