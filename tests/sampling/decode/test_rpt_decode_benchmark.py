"""``benchmarks/rpt_decode.py``: its bare calls are the samplers' calls, and the script runs end to end."""

import sys

import torch

from rpt.sampling.config import SamplingConfig
from rpt.sampling.decode.generate import generate
from tests.helpers.scripts import ROOT, load_script

SCRIPT = ROOT / "benchmarks" / "rpt_decode.py"


def test_bare_calls_decode_what_the_decoder_decodes():
    # The ceiling the benchmark prints is only meaningful if its bare fused call is the decoder's
    # common-path call: the NTP row must be unaffected by the PTP row riding along and by the crop.
    bench = load_script("benchmarks/rpt_decode.py")
    model = bench.build("tiny", "cpu", torch.float64)
    with torch.no_grad():  # a larger init than the default, so greedy decoding does not settle on one token
        for p in model.lm.parameters():
            if p.dim() == 2:
                p.mul_(20)
    prompt = torch.randint(0, model.config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(0))
    new = 16
    expected = generate(model, prompt, SamplingConfig(max_new_tokens=new, rpt_iters=0)).sequences[:, 10:]
    with torch.inference_mode():
        _, plain = bench.bare_calls(model, prompt, new, fused=False)
        _, fused = bench.bare_calls(model, prompt, new, fused=True)
    assert len(set(expected.flatten().tolist())) > 8
    assert torch.equal(plain, expected)
    assert torch.equal(fused, expected)


def test_script_reports_ratios_calls_and_ceiling(monkeypatch, capsys):
    # its main() in this process (a python process more costs ~5 s of imports); it sets torch's threads to 1
    bench = load_script("benchmarks/rpt_decode.py")
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--new-tokens", "6", "--prompt-tokens", "8", "--repeats", "1",
                                      "--batch", "2", "--corrections", "0.5"])
    threads = torch.get_num_threads()
    try:
        assert bench.main() == 0
    finally:
        torch.set_num_threads(threads)
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if "tokens/s   calls/new token" in line]
    assert len(rows) == 3 and rows[-1].startswith("rpt eta=")  # NTP, RPT, RPT where about half the sweeps accept
    assert all(" first call " in row and "FELL BACK" not in row for row in rows)

    def value(prefix: str) -> float:
        line = next(line for line in lines if line.startswith(prefix))
        return float(line.split(":")[1].split()[0].rstrip(";"))

    assert value("ntp / HF generate") > 0
    assert value("ratio rpt/ntp") > 0
    assert value("ceiling") > 0
    calls = next(line for line in lines if line.startswith("ratio rpt/ntp")).split("calls per new token:")[1]
    assert 0.9 < float(calls.split()[0]) < 3  # per row position: about one call per new token


def test_host_overhead_script_runs_sampled_decodes():
    """``benchmarks/host_overhead.py --temperature``: sampled NTP, RPT and HF runs are timed, and the
    RPT run reports its calls and accepted corrections per new token."""
    import argparse

    bench = load_script("benchmarks/host_overhead.py")
    args = argparse.Namespace(prompt_tokens=8, new_tokens=6, repeats=1, temperature=1.0)
    row = bench.measure(bench.micro_model(), 2, args)
    assert all(row[f"{name}_total"] > 0 for name in ("ntp", "rpt", "hf"))
    assert 0.9 < row["rpt_calls_per_token"] < 3
    assert 0 <= row["rpt_corrections_per_token"] <= 1  # at most one accepted correction per position (k = 1, w = 2)


def test_tail_script_compiles_the_rpt_step_tail_at_every_batch(capsys):
    """``benchmarks/rpt_tail_compile.py`` on the CPU (V = 512, ``aot_eager``): the RPT step's sampling tail
    (w = 3, LZ + repetition penalties), compiled at batch 1 and 2, equals the eager tail on every buffer;
    the script reports each case and exits 0 (the GPU pass runs it at V = 128256, bf16, batch 1-16)."""
    tail = load_script("benchmarks/rpt_tail_compile.py")
    argv = ["rpt_tail_compile.py", "--device", "cpu", "--vocab", "512", "--backend", "aot_eager", "--batches", "1", "2",
            "--configs", "penalties", "--window", "3", "--repeats", "1"]
    import unittest.mock

    with unittest.mock.patch.object(sys, "argv", argv):
        assert tail.main() == 0
    lines = capsys.readouterr().out.splitlines()
    cases = [line for line in lines if " B=" in line]
    assert len(cases) == 2 and all("equal to eager: True" in line for line in cases), lines
    assert lines[-1] == "0 of 2 cases failed"
