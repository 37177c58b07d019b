"""``generate(compile=True)`` on a CUDA device: the batch-flat steps replayed from CUDA graphs (inductor's
``mode="reduce-overhead"``, :mod:`rpt.sampling.decode.compile_mode`), several NTP and RPT steps per host read.

The GPU tests (``cuda`` marker, skipped without a device; ``make bench-gpu`` runs them, in strict mode:
a compile failure raises, never falls back) compare the graph-replayed decodes with eager decodes on
the same device and with the reference: float64 where the reference joins (no kernel difference can
move a near tie), float32 at batch 1, 4 (ragged) and 16 (exactly equal), bfloat16 with a stated
tolerance (a row may part from eager only at a near tie). On the CPU: that the CUDA choice is made
where it should be. Their CPU twins (``aot_eager``, several steps per read given a CPU entry) are in
``test_compiled_rpt.py``, ``test_compiled_ntp.py`` and ``test_decode_paths.py``."""

import pytest
import torch

from rpt.sampling import SamplingConfig, generate, generate_reference
from rpt.sampling.decode import compile_mode as step_compile
from rpt.sampling.decode import ntp_path
from tests.sampling.decode.test_decoder import prompts, rpt_model

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
    assert step_compile.STEPS_PER_TRANSFER["cuda"] > 1 and "cpu" not in step_compile.STEPS_PER_TRANSFER
    assert ntp_path.STEPS_PER_TRANSFER is step_compile.STEPS_PER_TRANSFER  # one table for NTP and RPT


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
    """Three prompt widths in one capacity bucket, the third unpadded: the second and third decodes
    compile (so capture) nothing new, and give the eager tokens. (It failed on an H100 at cf635d7: the
    step read the state's Python ``ragged`` flag while tracing, so an unpadded batch traced a second
    graph; the CPU twin is ``test_compiled_rpt.py::test_a_long_decode_runs_one_graph_padded_or_not``.)"""
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


LENGTHS = {1: (7,), 4: (9, 5, 7, 3), 16: tuple(3 + (5 * b) % 9 for b in range(16))}  # 1: unpadded


@pytest.fixture(scope="module")
def cuda_model32():
    return rpt_model(2).float().cuda()


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("batch", sorted(LENGTHS))
def test_float32_graphs_equal_eager_at_batch_1_4_16(cuda_model32, batch):
    """float32, batch 1 (unpadded), 4 and 16 (ragged): NTP and RPT (k = 1, corrections at confidence 0.3)
    replayed from CUDA graphs give exactly the eager tokens, corrections and calls, compiled (strict
    mode: no fallback)."""
    ids, mask = prompts(batch, LENGTHS[batch], seed=batch)
    ids, mask = ids.cuda(), mask.cuda()
    for rpt_iters in (0, 1):
        cfg = SamplingConfig(max_new_tokens=24, rpt_iters=rpt_iters, rpt_window=2, confidence=0.3,
                             repetition_penalty=1.2, eos_token_id=[])
        eager = generate(cuda_model32, ids, cfg, attention_mask=mask)
        graphs = generate(cuda_model32, ids, cfg, attention_mask=mask, compile=True)
        assert torch.equal(graphs.sequences, eager.sequences), (batch, rpt_iters)
        for key in ("forward_passes", "corrections"):
            assert graphs.stats[key] == eager.stats[key], key
        assert "compile_fallback" not in graphs.stats


def near_tie(model, seqs: torch.Tensor, mask: torch.Tensor, column: int, row: int) -> tuple[float, float]:
    """(top-2 gap, top logit) of the plain NTP logits predicting ``seqs[row, column]``."""
    full = torch.cat([mask, mask.new_ones(mask.shape[0], seqs.shape[1] - mask.shape[1])], 1)
    positions = (full.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=seqs, attention_mask=full, position_ids=positions).logits[row, column - 1].float()
    top = logits.topk(2).values
    return float(top[0] - top[1]), float(top[0].abs())


@pytest.mark.cuda
@needs_cuda
def test_bfloat16_graphs_part_from_eager_only_at_near_ties():
    """bfloat16, batch 4 ragged, NTP and RPT (k = 1, confidence 1: the NTP proposals decide): a row of the
    graph-replayed decode may differ from the eager one only from a position where the eager logits
    nearly tie -- the top two within 2^-5 of the top logit's magnitude (4 bf16 ulps) -- since kernels
    that sum in another order may round a logit across such a tie (docs/sampling.md); at least half the
    rows agree throughout."""
    model = rpt_model(2).to(torch.bfloat16).cuda()
    ids, mask = prompts(4, LENGTHS[4], seed=5)
    ids, mask = ids.cuda(), mask.cuda()
    width = ids.shape[1]
    for rpt_iters in (0, 1):
        cfg = SamplingConfig(max_new_tokens=24, rpt_iters=rpt_iters, rpt_window=2, confidence=1.0, eos_token_id=[])
        eager = generate(model, ids, cfg, attention_mask=mask).sequences
        graphs = generate(model, ids, cfg, attention_mask=mask, compile=True).sequences
        same = 0
        for row in range(4):
            differ = (eager[row, width:] != graphs[row, width:]).nonzero()
            if not len(differ):
                same += 1
                continue
            gap, top = near_tie(model, eager, mask, width + int(differ[0]), row)
            assert gap <= top * 2**-5, (rpt_iters, row, int(differ[0]), gap, top)
        assert same >= 2, (rpt_iters, same)
