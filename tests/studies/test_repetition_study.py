import json
import math

import pytest
import torch
import torch.nn.functional as F

from rpt.model import RPTForCausalLM
from rpt.studies.repetition import study
from tests.helpers.scripts import load_script
from tests.helpers.tiny_models import save_tiny_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("rep") / "ckpt")


def test_settings_cover_the_paper_sweeps():
    settings = study.study_settings([0.0, 0.1], rpt_iters=1)
    names = [s.name for s in settings]
    assert len(settings) == 2 * (1 + 5 + 10 + 1 + 1)
    assert "repetition=1.25@T=0" in names and "frequency=1@T=0.1" in names and "rpt_lz@T=0" in names
    rpt_lz = [s for s in settings if s.family == "rpt_lz"][0]
    from rpt.sampling.config import SamplingConfig

    cfg = rpt_lz.config(SamplingConfig())
    assert (cfg.lz_penalty, cfg.lz_window, cfg.lz_buffer, cfg.rpt_iters) == (0.15, 512, 32, 1)
    assert len(study.study_settings([0.0], rpt_iters=0)) == 17


def test_summary_rates_and_means():
    settings = study.study_settings([0.0], rpt_iters=0)[:2]
    records = {settings[0].name: [{"degenerate": True, "loglik": -1.0, "new_tokens": 10},
                                  {"degenerate": False, "loglik": -3.0, "new_tokens": 20}]}
    rows = study.summarise(settings, records)
    assert rows[0]["degenerate_rate"] == 0.5 and rows[0]["mean_loglik"] == -2.0 and rows[0]["mean_new_tokens"] == 15
    assert rows[1]["n"] == 0 and rows[1]["degenerate_rate"] is None


def test_continuation_loglik_matches_manual(ckpt):
    model = RPTForCausalLM.from_pretrained(ckpt).eval()
    prompt, cont = [5, 6, 7], [8, 9]
    with torch.no_grad():
        logp = F.log_softmax(model(torch.tensor([prompt + cont])).logits[0].float(), -1)
    manual = (logp[2, 8] + logp[3, 9]).item() / 2
    assert study.continuation_loglik(model, prompt, cont) == pytest.approx(manual, rel=1e-5)
    assert math.isnan(study.continuation_loglik(model, prompt, []))


def test_script_end_to_end_and_resume(ckpt, tmp_path, monkeypatch, capsys):
    script = load_script("eval/repetition.py")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["def add(a,", "for i in", "class P"]) + "\n")
    out = tmp_path / "rep.json"
    argv = ["--checkpoint", ckpt, "--prompts", str(prompts), "--limit", "3", "--max-new-tokens", "24", "--min-repeats", "4",
            "--families", "none", "repetition", "lz", "rpt_lz", "--ignore-eos", "--out", str(out)]
    assert script.main(argv) == 0
    summary = json.loads(out.read_text())
    assert set(summary["degenerate_rate"]) == {"none", "repetition", "lz", "rpt_lz"}
    assert len(summary["settings"]) == 1 + 5 + 1 + 1 and all(s["n"] == 3 for s in summary["settings"])
    assert all(0 <= s["degenerate_rate"] <= 1 and s["mean_loglik"] < 0 for s in summary["settings"])
    assert (tmp_path / "rep.md").exists() and (tmp_path / "rep.png").stat().st_size > 1000
    # a rerun on the same output generates nothing
    monkeypatch.setattr(script, "generate_texts", lambda *a, **k: pytest.fail("regenerated a finished item"))
    assert script.main(argv) == 0
    assert json.loads(out.read_text())["settings"] == summary["settings"]
    # bad input: one clear line, exit code 2
    assert script.main(["--checkpoint", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "error:" in capsys.readouterr().err
