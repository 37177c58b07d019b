"""Table 1 in one command: every benchmark and window runs, the table is assembled from their files,
a rerun reuses everything, the relative changes and the cells' n and 95% Wilson intervals are right on
hand-made examples (published values and a brute-force inversion of the score test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rpt.evaluation import evalplus_scoring as plus
from rpt.evaluation import table1
from tests.helpers.eval_helpers import gsm8k_folder, long_context_checkpoint
from tests.helpers.scripts import load_script

needs_evalplus = pytest.mark.skipif(not (plus.data_dir() / plus.FILES["mbpp"]).is_file(),
                                    reason=f"EvalPlus data not found at {plus.data_dir()}; set RPT_EVALPLUS_DIR")


def test_plan_measures_ntp_once():
    runs = table1.plan([2, 3], [0, 1, 2], ["humaneval_plus", "gsm8k"])
    assert [(r.benchmark, r.window, r.iters) for r in runs] == [
        ("humaneval_plus", 2, (0, 1, 2)), ("gsm8k", 2, (0, 1, 2)), ("humaneval_plus", 3, (1, 2)), ("gsm8k", 3, (1, 2))]


def summary(metric: str, best: dict[str, tuple[float, float]], n: int) -> dict:
    """A benchmark run's JSON as far as the table reads it: best over temperatures, and n per setting."""
    n_key = "n" if metric == "accuracy" else "n_problems"
    return {"best_of_temperatures": {k: {"rpt_iters": int(k), "temperature": t, metric: v} for k, (v, t) in best.items()},
            "settings": [{"rpt_iters": int(k), "temperature": t, n_key: n} for k, (_, t) in best.items()]}


def test_rows_best_of_temperatures_and_relative_change():
    outputs = {
        table1.Run("humaneval_plus", 2, (0, 1)): summary("pass@1", {"0": (0.40, 0.0), "1": (0.50, 0.05)}, 20),
        table1.Run("gsm8k", 2, (0, 1)): summary("accuracy", {"0": (0.0, 0.0), "1": (0.25, 0.1)}, 4),
        table1.Run("humaneval_plus", 3, (1,)): summary("pass@1", {"1": (0.30, 0.1)}, 20),
    }
    rows = table1.rows_from(outputs)
    assert [(r["window"], r["rpt_iters"]) for r in rows] == [(None, 0), (2, 1), (3, 1)]
    ntp, w2, w3 = rows
    assert {k: v for k, v in w2["HumanEval+"].items() if k != "interval"} == {
        "score": 0.5, "temperature": 0.05, "n": 20, "change": pytest.approx(0.1), "relative_change": pytest.approx(0.25)}
    assert w3["HumanEval+"]["relative_change"] == pytest.approx(-0.25)
    assert w2["GSM8K"]["relative_change"] is None and w2["GSM8K"]["change"] == 0.25  # NTP scored 0
    assert w2["GSM8K"]["n"] == 4 and w2["GSM8K"]["interval"] is None  # 4 problems: no interval
    headers, body = table1.markdown_rows(rows)
    # 10/20 and 6/20: Wilson 95% intervals [0.2993, 0.7007] and [0.1455, 0.5190] (by hand:
    # centre (p + z^2/2n) / (1 + z^2/n), half-width z / (1 + z^2/n) * sqrt(p(1-p)/n + z^2/4n^2), z = 1.96)
    assert body[1][3] == "50.0 [29.9, 70.1], n = 20 (+25.0%)" and body[2][3] == "30.0 [14.5, 51.9], n = 20 (-25.0%)"
    assert body[1][5] == "25.0, n = 4: n too small (+25.0 pt)" and body[0][5] == "0.0, n = 4: n too small"
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
    assert all(cell["n"] == 1 and cell["interval"] is None for row in table["rows"] for cell in
               (row["HumanEval+"], row["MBPP+"], row["GSM8K"]))
    assert "n = 1: n too small" in (out / "table1.md").read_text()
    assert (out / "table1.png").read_bytes()[:4] == b"\x89PNG"

    stores = {p: p.read_bytes() for p in Path(out).glob("*.items.jsonl")}
    assert len(stores) == 6
    assert script.main(argv) == 0  # resumed: nothing generated or executed again
    assert {p: p.read_bytes() for p in Path(out).glob("*.items.jsonl")} == stores
    assert json.loads((out / "table1.json").read_text())["rows"] == table["rows"]


def test_chat_reaches_every_benchmark_run():
    args = load_script("eval/table1.py").build_parser().parse_args(["--checkpoint", "ckpt", "--chat"])
    for run in table1.plan([2], [0, 1], [b for _, b, _ in table1.COLUMNS]):
        assert "--chat" in table1.argv_for(run, args)
    args.chat = False
    assert "--chat" not in table1.argv_for(table1.Run("gsm8k", 2, (0,)), args)


def test_a_run_whose_json_has_no_n_gives_no_interval():
    outputs = {table1.Run("gsm8k", 2, (0,)): {"best_of_temperatures": {"0": {"rpt_iters": 0, "temperature": 0.0,
                                                                           "accuracy": 0.5}}}}
    cell = table1.rows_from(outputs)[0]["GSM8K"]
    assert cell["n"] is None and cell["interval"] is None
    assert table1.markdown_rows(table1.rows_from(outputs))[1][0][5] == "50.0, n unknown"
