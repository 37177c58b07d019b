"""``generate(compile=True)`` on a CUDA device: the batch-flat steps replayed from CUDA graphs (inductor's
``mode="reduce-overhead"``, :mod:`rpt.sampling.step_compile`), several NTP steps per host read.

The GPU tests (``cuda`` marker, skipped without a device; ``make bench-gpu`` runs them) compare the
graph-replayed decodes with eager decodes on the same device and with the reference, float64 so that
no kernel difference can move a near tie. On the CPU: that the CUDA choice is made where it should be."""

import pytest
import torch

from rpt.sampling import SamplingConfig, generate, generate_reference, ntp_path, step_compile
from tests.test_decoder import prompts, rpt_model

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_cuda_with_inductor_means_graphs(monkeypatch):
    """compile_step asks for ``mode="reduce-overhead"`` (CUDA graphs) on CUDA with inductor, and for the
    named backend, without a mode, elsewhere; NTP reads the host once per several steps on CUDA only."""
    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw) or fn)
    step_compile.compile_step(len, "inductor", torch.device("cuda", 0))
    step_compile.compile_step(len, "inductor", torch.device("cpu"))
    step_compile.compile_step(len, "aot_eager", torch.device("cuda", 0))
    assert seen[0]["mode"] == "reduce-overhead" and "backend" not in seen[0]
    assert [kw.get("mode") for kw in seen[1:]] == [None, None]
    assert [kw["backend"] for kw in seen[1:]] == ["inductor", "aot_eager"]
    assert all(kw["fullgraph"] and kw["dynamic"] is False for kw in seen)
    assert ntp_path.STEPS_PER_TRANSFER["cuda"] > 1 and "cpu" not in ntp_path.STEPS_PER_TRANSFER


@pytest.fixture(scope="module")
def cuda_model():
    return rpt_model(2).cuda()


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("rpt_iters", [0, 1])
def test_graph_replayed_decode_equals_eager(cuda_model, rpt_iters):
    """NTP (8 steps per read) and RPT k = 1, greedy with LZ + repetition penalties and seeded sampling,
    ragged rows, one row stopping at EOS: graph-replayed tokens == eager (CUDA) == reference; no step
    skipped its CUDA graph."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    ids, mask = prompts(3, seed=31)
    ids, mask = ids.cuda(), mask.cuda()
    pen = dict(rpt_iters=rpt_iters, rpt_window=2, confidence=0.3, repetition_penalty=1.3, lz_penalty=0.5,
               lz_window=16, max_new_tokens=24)
    free = generate(cuda_model, ids, SamplingConfig(**pen, eos_token_id=[]), attention_mask=mask)
    for cfg in (SamplingConfig(**pen, eos_token_id=free.generated(1)[5]),
                SamplingConfig(**pen, eos_token_id=[], temperature=0.9, top_k=8, seed=3)):
        eager = generate(cuda_model, ids, cfg, attention_mask=mask)
        graphs = generate(cuda_model, ids, cfg, attention_mask=mask, compile=True)
        ref = generate_reference(cuda_model, ids, cfg, attention_mask=mask)
        assert torch.equal(graphs.sequences, eager.sequences) and torch.equal(graphs.sequences, ref.sequences)
        assert graphs.finish_reasons == eager.finish_reasons
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])


@pytest.mark.cuda
@needs_cuda
def test_prompt_widths_of_one_bucket_share_the_graphs(cuda_model):
    """Three prompt widths in one capacity bucket: the second and third decodes compile (so capture)
    nothing new, and give the eager tokens."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    cfg = SamplingConfig(max_new_tokens=20, rpt_iters=1, rpt_window=2, confidence=1.0, eos_token_id=[])
    graphs = []
    for lengths in ((9, 5), (12, 7), (10, 10)):
        ids, mask = prompts(2, lengths, seed=sum(lengths))
        ids, mask = ids.cuda(), mask.cuda()
        out = generate(cuda_model, ids, cfg, attention_mask=mask, compile=True)
        assert torch.equal(out.sequences, generate(cuda_model, ids, cfg, attention_mask=mask).sequences)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] == graphs[1] == graphs[2], graphs
