"""The scaling study (eval/scaling.py): its protocol, fits with known answers, the crossover's
bootstrap on synthetic data, the measurement on a tiny checkpoint, the summary and report, and the
registration guard that refuses the official seeds unless the protocol is committed by content
before any official result."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from rpt.statistics import seeds_and_units_means
from rpt.studies import preregistration as guard
from rpt.studies.scaling import fits, report
from rpt.studies.scaling import run as runner
from rpt.studies.scaling import summary as study
from rpt.studies.scaling.design import CONFIG, Design, Size, plan
from rpt.studies.scaling.measure import RULES, fixed_positions, measure

ROOT = Path(__file__).resolve().parents[2]


# ---- the protocol ------------------------------------------------------------------------------------------
def test_the_registered_protocol_spans_30x_at_a_fixed_tokens_per_parameter():
    design = Design.load(ROOT / CONFIG)
    counts = [s.parameters() for s in design.sizes]
    assert len(counts) >= 4 and counts[-1] / counts[0] >= 30 and len(design.seeds) == 2
    for size in design.sizes:
        assert design.training_tokens(size) / size.parameters() == pytest.approx(design.tokens_per_parameter, rel=0.01)
        assert design.batch(size) <= design.reference_batch and min(design.steps(size)) >= 100
    assert design.batch(design.sizes[-1]) == 16  # the demo's batch at the largest size


@pytest.mark.parametrize("size", [Size(16, 1, 48, 2), Size(64, 2, 176, 4), Size(192, 3, 512, 4)])
def test_parameter_count_is_the_models(size):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=4096, hidden_size=size.hidden_size, num_hidden_layers=size.num_hidden_layers,
                      intermediate_size=size.intermediate_size, num_attention_heads=size.num_attention_heads,
                      num_key_value_heads=size.num_attention_heads, tie_word_embeddings=True)
    with torch.device("meta"):  # shapes only: no memory, no init time
        model = LlamaForCausalLM(cfg)
    assert sum(p.numel() for p in model.parameters()) == size.parameters()


def test_plan_trains_each_size_and_seed_from_its_own_pretraining(tmp_path):
    design = Design.load(ROOT / CONFIG)
    models = plan(design, [7, 8], tmp_path, "TOK")
    assert len(models) == 2 * len(design.sizes) and len({m.name for m in models}) == len(models)
    for m in models:
        assert "tokenizer=TOK" in m.pretrain.overrides and f"seed={m.seed}" in m.pretrain.overrides
        assert f"init_from={m.pretrain.final}" in m.finetune.overrides and f"seed={m.seed}" in m.finetune.overrides
        assert f"model.hidden_size={m.size.hidden_size}" in m.pretrain.overrides
        pre, ft = design.steps(m.size)
        assert f"max_steps={pre}" in m.pretrain.overrides and f"max_steps={ft}" in m.finetune.overrides
    with pytest.raises(ValueError, match="increasing"):
        dataclasses.replace(design, sizes=design.sizes[::-1]).check()


# ---- fits with known answers --------------------------------------------------------------------------------
def test_log_linear_crossover_is_exact_on_a_line():
    x = np.array([4.0, 5.0, 6.0, 7.0])
    y = 0.1 - 0.02 * (x - 3.0)  # zero at x = 8
    ab = fits.log_linear(x, y)
    assert ab == pytest.approx([0.16, -0.02])
    assert float(fits.crossover(ab)) == pytest.approx(8.0)
    assert math.isinf(float(fits.crossover(fits.log_linear(x, 0.1 + 0.01 * x))))  # rising: never turns negative
    rows = fits.log_linear(x, np.stack([y, 2 * y]))
    assert rows.shape == (2, 2) and rows[1] == pytest.approx(2 * rows[0])


def test_power_law_with_offset_recovers_its_parameters():
    n = np.logspace(4.8, 6.4, 6)
    fit = fits.power_offset(n, 3.0 + 40.0 * n ** -0.3)
    assert fit["c"] == pytest.approx(3.0, abs=1e-3) and fit["alpha"] == pytest.approx(0.3, abs=1e-3)
    assert fits.power_offset_value(fit, 1e7) == pytest.approx(3.0 + 40.0 * 1e7 ** -0.3, abs=1e-3)


def replicates(sizes, resamples, seed):
    return seeds_and_units_means([(m.num, m.den) for m in sizes], resamples, seed)


def test_a_measured_mean_is_token_weighted():
    m = fits.Measured(np.array([[10.0, 1.0]]), np.array([[5.0, 1.0]]))
    assert m.mean() == pytest.approx(11.0 / 6.0)  # a token-weighted mean, as the trainer logs losses


def synthetic_sizes(log_n, truth, seeds=2, n=300, noise=0.05, seed=0):
    rng = np.random.default_rng(seed)
    return [fits.Measured.of_means(t + rng.normal(0.0, noise, size=(seeds, n))) for t in truth]


def test_crossover_bootstrap_covers_the_known_crossover():
    log_n = np.array([4.8, 5.2, 5.6, 6.0, 6.3])
    truth = 0.05 - 0.02 * (log_n - 4.8)  # crosses zero at 7.3
    sizes = synthetic_sizes(log_n, truth)
    means = np.array([m.mean() for m in sizes])
    c = fits.crossover_summary(log_n, means, replicates(sizes, 1000, seed=3))
    lo, hi = c["log10_crossover_ci95"]
    assert lo < 7.3 < hi and c["share_no_crossover"] < 0.05 and c["where"].startswith("above the largest")
    flat = synthetic_sizes(log_n, np.full(5, 0.03), noise=0.5)
    cf = fits.crossover_summary(log_n, np.array([m.mean() for m in flat]), replicates(flat, 1000, seed=3))
    assert cf["log10_crossover_ci95"][1] is None and cf["share_no_crossover"] > 0.2  # no bound can be stated


def test_leave_largest_out_holds_on_the_line_and_fails_off_it():
    log_n = np.array([4.8, 5.2, 5.6, 6.0, 6.3])
    truth = 0.05 - 0.02 * (log_n - 4.8)
    for shift, held in ((0.0, True), (0.05, False)):
        sizes = synthetic_sizes(log_n, truth + np.array([0, 0, 0, 0, shift]), noise=0.1)
        means = np.array([m.mean() for m in sizes])
        r = fits.leave_largest_out(log_n, means, replicates(sizes, 1000, seed=4))
        assert r["held"] is held and r["predicted"] == pytest.approx(truth[-1], abs=0.01)


# ---- measurement, summary and report ---------------------------------------------------------------------------
def test_measure_on_a_tiny_checkpoint_and_read_back(tmp_path, monkeypatch):
    from tests.helpers.tiny_models import save_tiny_checkpoint

    run_dir = tmp_path / "ft"
    save_tiny_checkpoint(run_dir / "final", window=2)
    (run_dir / "eval_batches.json").write_text(json.dumps(
        {"step": 5, "batch": [0, 1], "sum": [[20.0, 18.0], [30.0, 33.0]], "count": [[10, 10], [10, 10]]}))
    design = dataclasses.replace(Design.load(ROOT / CONFIG), positions=6, excess_positions=3, top_m=4)
    docs = [list(np.random.default_rng(0).integers(1, 200, size=40)) for _ in range(2)]
    positions, excess = fixed_positions(docs, design)
    assert len(positions) == 6 and len(excess) == 3 and all(t + 1 < len(docs[d]) for d, t in excess)
    result = measure("m", run_dir, tmp_path / "measured", design, docs, positions, excess, {"seed": 0})
    assert result["losses"]["ntp"] == pytest.approx(2.5) and result["losses"]["ptp_1"] == pytest.approx(2.55)
    from rpt.evaluation.batched_generation import load_checkpoint

    model = load_checkpoint(str(run_dir / "final"), "cpu")[0]
    for name in RULES:
        ea = result["error_analysis"][name]
        assert len(ea["p0"]) == 6 and all(0.0 <= p <= 1.0 for p in ea["p0"] + ea["p1"])
        d, t = positions[0]  # p_0 is the NTP probability of the true token: one plain forward
        with torch.no_grad():
            logits = model(torch.tensor([docs[d][max(0, t - design.context_len):t]])).logits[0, -1]
        assert ea["p0"][0] == pytest.approx(torch.softmax(logits.double(), -1)[docs[d][t]].item(), rel=1e-4)
    assert all(math.isfinite(x) for x in result["ptp_excess"]["head"] + result["ptp_excess"]["implied"])
    monkeypatch.setattr("rpt.evaluation.batched_generation.load_checkpoint", lambda *a, **k: pytest.fail("measured again"))
    again = measure("m", run_dir, tmp_path / "measured", design, docs, positions, excess, {"seed": 0})
    assert again["error_analysis"] == result["error_analysis"]


def synthetic_models(params=(69_000, 143_000, 363_000, 914_000, 2_114_000), seeds=(0, 1)):
    rng = np.random.default_rng(0)
    models = []
    for n in params:
        x = math.log10(n)
        for seed in seeds:
            cnt = np.full((12, 2), 1000.0)
            loss = 3.0 + 40.0 * n ** -0.3 + rng.normal(0.0, 0.01, (12, 2))
            p0 = rng.uniform(0.0, 1.0, 100)
            ea = {r: {"p0": p0.tolist(), "p1": np.clip(p0 - (0.1 - 0.02 * x) + rng.normal(0, 0.02, 100), 0, 1).tolist(),
                      "bound": [0.0] * 100} for r in RULES}
            models.append({"name": f"n{n}_s{seed}", "size": f"n{n}", "seed": seed, "parameters": n,
                           "training_tokens": n, "batch": 1, "steps": [1, 1], "checkpoint": "-",
                           "losses": {"ntp": 0.0, "ptp_1": 0.0, "batch_sum": (loss * cnt).tolist(),
                                      "batch_count": cnt.tolist()},
                           "error_analysis": ea,
                           "ptp_excess": {"head": (2.0 - 0.3 * x + rng.normal(0, 0.1, 40)).tolist(), "implied": [0.0] * 40}})
    return models


def test_summary_and_report_on_synthetic_models(tmp_path):
    summary = study.summarise(synthetic_models(), resamples=200, predicted_crossover=(4.5, None))
    c = summary["crossover"]["sampled_0"]
    assert c["log10_crossover"] == pytest.approx(5.0, abs=0.1)  # eps change 0.1 - 0.02 log10 N
    p = summary["predictions"]
    assert p["crossover_as_registered"]["held"]
    assert not study.predictions(summary["quantities"], (5.5, None))["crossover_as_registered"]["held"]
    assert study.in_range(None, (7.0, None)) and not study.in_range(None, (4.0, 9.0))
    assert p["excess_falls"]["held"] and p["largest_eps_change_sampled_0"]["held"] and p["largest_ntp_loss"]["held"]
    assert summary["quantities"]["ntp_loss"]["power_offset"]["alpha"] == pytest.approx(0.3, abs=0.1)
    summary.update(official=False, registration=None, code={"commit": "0" * 40}, seeds=[0, 1],
                   models=[runner._model_row(m, None) for m in synthetic_models()])
    text = report.notes(summary) + "\n".join(str(t) for t in report.tables(summary))
    assert "Development run" in text and "N* = 10^5.0" in text and "largest_eps_change_sampled_0" in text
    # write_outputs and the figure: the slow miniature below (a figure costs seconds to render)
    from rpt.demo.report_json import scaling_study_line
    from rpt.result_files import write_json

    assert scaling_study_line(tmp_path / "none.json").startswith("not run yet")
    line = scaling_study_line(write_json(tmp_path / "s.json", summary))
    assert line.startswith("Development scaling study") and "N* = 10^5.0" in line and "\n" not in line


# ---- the registration guard ----------------------------------------------------------------------------------
def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


def _commit(root: Path, *paths: str, message: str = "c") -> None:
    _git(root, "add", *paths)
    _git(root, "commit", "-q", "-m", message)


def test_guard_checks_the_protocol_by_content_and_before_the_result(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    files = ["docs/prereg.md", "cfg.yaml"]

    def refused() -> str:
        with pytest.raises(guard.NotPreregistered) as err:
            guard.check_before_result(repo, files, "docs/result.json", "FIX")
        assert str(err.value).endswith("FIX")
        return str(err.value)

    assert "not a git work tree" in refused()
    _git(repo, "init", "-q")
    assert "no commit" in refused()
    (repo / "docs/prereg.md").write_text("prediction A\n")
    (repo / "cfg.yaml").write_text("steps: 10\n")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "root")
    assert "in no commit" in refused()  # written, not committed
    _commit(repo, *files, message="register")
    first = guard.check_before_result(repo, files, "docs/result.json", "FIX")
    assert set(first) == set(files) and all(len(r["commit"]) == 40 for r in first.values())
    (repo / "cfg.yaml").write_text("steps: 10\r\n")  # one byte differs: a line ending
    assert "cfg.yaml as it is now is in no commit" in refused()
    (repo / "cfg.yaml").write_text("steps: 11\n")
    _commit(repo, "cfg.yaml", message="protocol change before any result")
    second = guard.check_before_result(repo, files, "docs/result.json", "FIX")
    assert second["cfg.yaml"]["commit"] != first["cfg.yaml"]["commit"]
    (repo / "docs/result.json").write_text("{}\n")
    _commit(repo, "docs/result.json", message="official result")
    assert guard.check_before_result(repo, files, "docs/result.json", "FIX") == second  # a rerun after the result is fine
    (repo / "docs/prereg.md").write_text("prediction B\n")
    _commit(repo, "docs/prereg.md", message="edited after the result")
    assert "not before the official result" in refused()
    (repo / "docs/prereg.md").write_text("prediction A\n")  # back to the registered bytes
    _commit(repo, "docs/prereg.md", message="revert")
    assert guard.check_before_result(repo, files, "docs/result.json", "FIX")["docs/prereg.md"] == first["docs/prereg.md"]
    monkeypatch.setattr(guard.shutil, "which", lambda name: None)
    assert "git is not installed" in refused()


def test_official_seeds_are_refused_before_any_work(tmp_path, capsys, monkeypatch):
    from tests.helpers.scripts import load_script

    design = Design.load(ROOT / CONFIG)
    work = tmp_path / "work"
    with pytest.raises(runner.Refused, match="not a git work tree"):
        runner.run(design, list(design.seeds), work, root=tmp_path)
    with pytest.raises(runner.Refused, match="registered protocol only"):
        runner.run(design, [design.seeds[0]], work, root=tmp_path)
    with pytest.raises(runner.Refused, match="registered protocol only"):
        runner.run(design, list(design.seeds), work, changed=True, root=tmp_path)
    assert not work.exists()
    assert not runner.is_official(design, [100, 101])
    script = load_script("eval/scaling.py")
    monkeypatch.setattr(runner, "ROOT", tmp_path)
    out = tmp_path / "o.json"
    assert script.main(["--work", str(work), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and runner.PREREGISTRATION in err[0]
    assert not out.exists() and not work.exists()


# ---- the miniature, end to end ------------------------------------------------------------------------------
@pytest.mark.slow
def test_miniature_study_end_to_end(tmp_path):
    """Two sizes, one development seed, a few steps each, trained in process on the demo's corpus;
    measured, summarised and written (JSON, markdown, figure); a rerun trains and measures nothing."""
    from tests.helpers.inprocess_train import train_main

    trained = []

    def train_in_process(jobs):
        from rpt.result_files import write_json

        for job in jobs:
            trained.append(job)
            job.run_dir.mkdir(parents=True, exist_ok=True)
            assert train_main(str(ROOT / job.config), f"output_dir={job.run_dir}", "resume=none", "log_every=100",
                              "plot=false", "data_workers=0", *job.overrides) == 0
            write_json(job.run_dir / "controlled_run.json", {"config": job.config, "overrides": job.overrides})

    design = dataclasses.replace(Design.load(ROOT / CONFIG), tokens_per_parameter=0.02, positions=24,
                                 excess_positions=4, bootstrap_resamples=200)
    work = tmp_path / "work"
    kw = dict(runner=train_in_process, sizes=2, extra_overrides=["eval_batches=2"])
    summary = runner.run(design, [100, 101], work, **kw)
    assert len(trained) == 8 and not summary["official"] and summary["registration"] is None
    assert [m["parameters"] for m in summary["models"]] == [68_912, 68_912, 142_944, 142_944]
    paths = runner.write_outputs(tmp_path / "mini.json", summary)
    assert all(p.exists() and p.stat().st_size > 0 for p in paths)
    saved = json.loads(paths[0].read_text())
    assert set(saved["crossover"]) == set(RULES) and all(isinstance(p["held"], bool) for p in saved["predictions"].values())
    trained.clear()
    again = runner.run(design, [100, 101], work, **kw)
    assert not trained and json.dumps(again["quantities"]) == json.dumps(summary["quantities"])  # NaN-safe
    assert all(q["leave_largest_out"] is None for q in summary["quantities"].values())  # two sizes: no held-out fit
