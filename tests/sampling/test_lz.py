"""The LZ penalty against a plain-loop implementation of its definition, and as an HF processor."""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LogitsProcessorList

import rpt.sampling.lz.incremental as lz_incremental
from rpt.sampling import LZPenaltyLogitsProcessor, lz_penalty
from rpt.sampling.lz.processor import ClosestLongestLZLogitsProcessor
from tests.helpers.tiny_models import tiny_llama


def brute_lz(context: list[int], vocab: int, window: int, buffer: int) -> torch.Tensor:
    """The issue's definition, literally: 1-based c_1..c_m, loops over j and s."""
    c = [None] + list(context[-window:]) if window else [None]
    m = len(c) - 1
    log_v = math.log2(vocab)
    best: dict[int, float] = {}
    for j in range(1, m + 1):
        s = 0
        while s < buffer and j - 1 - s >= 1 and c[j - 1 - s] == c[m - s]:
            s += 1
        length, dist = s + 1, m + 1 - j
        cost = (math.log2(dist + 1) + math.log2(length)) / length
        best[c[j]] = min(best.get(c[j], math.inf), cost)
    out = torch.zeros(vocab, dtype=torch.float64)
    for v, cost in best.items():
        out[v] = log_v - min(max(cost, 0.0), log_v)
    return out


def periodic(rows: int, length: int, period: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    base = torch.randint(0, vocab, (rows, period), generator=gen)
    return base.repeat(1, length // period + 1)[:, :length]


def check_rows(ctx: torch.Tensor, vocab: int, window: int, buffer: int, got: torch.Tensor) -> None:
    for r in range(ctx.shape[0]):
        want = brute_lz(ctx[r].tolist(), vocab, window, buffer).float()
        torch.testing.assert_close(got[r], want, atol=1e-5, rtol=1e-5)


def test_worked_example():
    p = lz_penalty(torch.tensor([5, 6, 7, 5, 6]), 16)
    assert p.shape == (16,)
    assert abs(p[7].item() - (4 - (2 + math.log2(3)) / 3)) < 1e-4 and abs(p[7].item() - 2.8050) < 1e-4
    assert abs(p[5].item() - 2.4150) < 1e-4
    assert abs(p[6].item() - 3.0) < 1e-4
    assert p[9].item() == 0.0
    assert torch.count_nonzero(p).item() == 3


@pytest.mark.parametrize(
    "vocab,window,buffer,length,rows",
    [
        (3, 8, 4, 30, 1),  # W < context, tiny alphabet: long matches everywhere
        (3, 64, 32, 30, 32),  # W > context
        (17, 16, 1, 50, 32),
        (17, 512, 32, 200, 32),
        (1000, 50, 8, 120, 1),
        (50_000, 600, 32, 700, 1),
        (50_000, 64, 32, 40, 32),
    ],
)
def test_matches_definition_random(vocab, window, buffer, length, rows):
    gen = torch.Generator().manual_seed(vocab + window + length)
    ctx = torch.randint(0, vocab, (rows, length), generator=gen)
    check_rows(ctx, vocab, window, buffer, lz_penalty(ctx, vocab, window, buffer))


@pytest.mark.parametrize("period", [1, 2, 3, 7, 40])
@pytest.mark.parametrize("window,buffer", [(512, 32), (20, 4), (100, 50)])
def test_matches_definition_periodic(period, window, buffer):
    gen = torch.Generator().manual_seed(period)
    vocab = 50
    ctx = periodic(4, 150, period, vocab, gen)
    ctx[1, 70] = (ctx[1, 70] + 1) % vocab  # one glitch breaks the long match in one row
    check_rows(ctx, vocab, window, buffer, lz_penalty(ctx, vocab, window, buffer))


def test_rows_of_different_lengths_lengths_and_mask():
    gen = torch.Generator().manual_seed(1)
    vocab, window, buffer, width = 11, 24, 5, 40
    lengths = torch.tensor([0, 1, 2, 13, 24, 25, 40, 7])
    ctx = torch.randint(0, vocab, (len(lengths), width), generator=gen)
    ctx[2:4] = periodic(2, width, 3, vocab, gen)
    got = lz_penalty(ctx, vocab, window, buffer, lengths=lengths)
    mask = torch.arange(width)[None] >= width - lengths[:, None]  # left padding
    got_mask = lz_penalty(ctx, vocab, window, buffer, mask=mask)
    for r, n in enumerate(lengths.tolist()):
        want = brute_lz(ctx[r, width - n:].tolist(), vocab, window, buffer).float()
        torch.testing.assert_close(got[r], want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got_mask[r], want, atol=1e-5, rtol=1e-5)


def test_padding_never_extends_a_match():
    # real tokens [y, x, y] after padding that continues the pattern: x's match is "y" (L = 2, D = 2),
    # not "x y" reaching into the padding (L = 3).
    x, y = 1, 2
    ctx = torch.tensor([[x, y, x, y, x, y]])
    got = lz_penalty(ctx, 4, 16, 8, lengths=torch.tensor([3]))
    assert abs(got[0, x].item() - (2 - (math.log2(3) + 1) / 2)) < 1e-5
    proc = LZPenaltyLogitsProcessor(1.0, 16, 8, prompt_length=torch.tensor([3]))
    torch.testing.assert_close(proc(ctx, torch.zeros(1, 4)), -got)


def test_mask_with_holes_drops_them():
    gen = torch.Generator().manual_seed(2)
    ctx = periodic(3, 60, 4, 9, gen)
    mask = torch.rand(3, 60, generator=gen) > 0.3
    got = lz_penalty(ctx, 9, 32, 8, mask=mask)
    for r in range(3):
        want = brute_lz(ctx[r][mask[r]].tolist(), 9, 32, 8).float()
        torch.testing.assert_close(got[r], want, atol=1e-5, rtol=1e-5)


def test_empty_context_and_range():
    assert torch.equal(lz_penalty(torch.zeros(3, 0, dtype=torch.long), 10), torch.zeros(3, 10))
    assert torch.equal(lz_penalty(torch.tensor([[4, 4]]), 10, lengths=torch.tensor([0])), torch.zeros(1, 10))
    p = lz_penalty(periodic(2, 300, 1, 5, torch.Generator().manual_seed(0)), 5)
    assert (p >= 0).all() and (p <= math.log2(5) + 1e-6).all()
    # one token repeated 300 times: a 33-long match (L = B + 1) one step back (D = 1) is cheapest
    assert abs(p.max().item() - (math.log2(5) - (1 + math.log2(33)) / 33)) < 1e-5


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(window=0), "window"),
        (dict(buffer=0), "buffer"),
        (dict(window=2.5), "window"),
        (dict(vocab_size=0), "vocab_size"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = dict(context=torch.tensor([[1, 2]]), vocab_size=8) | kwargs
    with pytest.raises(ValueError, match=match):
        lz_penalty(**args)


def test_bad_processor_arguments():
    with pytest.raises(ValueError, match="alpha"):
        LZPenaltyLogitsProcessor(-0.1)
    with pytest.raises(ValueError, match="window"):
        LZPenaltyLogitsProcessor(0.1, window=0)
    with pytest.raises(ValueError, match="buffer"):
        LZPenaltyLogitsProcessor(0.1, buffer=0)
    with pytest.raises(ValueError, match="prompt_length"):
        LZPenaltyLogitsProcessor(0.1, prompt_length=-1)
    with pytest.raises(ValueError, match="integer token ids"):
        lz_penalty(torch.tensor([1.0, 2.0]), 4)


@pytest.mark.parametrize("inplace,incremental", [(False, None), (True, None), (False, False), (True, True)])
def test_processor_equals_dense_penalty(inplace, incremental):
    gen = torch.Generator().manual_seed(3)
    rows, prompt, vocab, alpha = 5, 6, 300, 0.15
    ids = torch.cat([torch.randint(0, vocab, (rows, prompt), generator=gen),
                     periodic(rows, 50, 5, vocab, gen)], dim=1)
    ids[0, -20:] = torch.randint(0, vocab, (20,), generator=gen)
    scores = torch.randn(rows, vocab, generator=gen)
    proc = LZPenaltyLogitsProcessor(alpha, window=32, buffer=8, prompt_length=prompt, inplace=inplace,
                                    incremental=incremental)
    want = scores - alpha * lz_penalty(ids[:, prompt:], vocab, 32, 8)
    before = scores.clone()
    got = proc(ids, scores)
    torch.testing.assert_close(got, want)
    assert (got is scores) == inplace
    if not inplace:
        assert torch.equal(scores, before)
    # the scratch buffer is restored: a second call gives the same answer
    other = ids.flip(1)
    torch.testing.assert_close(proc(other, before.clone()), before - alpha * lz_penalty(other[:, prompt:], vocab, 32, 8))
    torch.testing.assert_close(proc(ids, before.clone()), want)


@pytest.mark.parametrize("window,buffer,period", [(24, 4, 3), (512, 32, 7), (16, 32, 1), (8, 2, 0)])
def test_incremental_decode_loop_equals_definition(monkeypatch, window, buffer, period):
    """Growing by one token per call, the carried match lengths equal a fresh computation."""
    gen = torch.Generator().manual_seed(window + period)
    rows, vocab, prompt, steps = 3, 20, 2, 90
    seq = periodic(rows, prompt + steps, period, vocab, gen) if period else \
        torch.randint(0, 4, (rows, prompt + steps), generator=gen)
    seq[1, 40:45] = torch.randint(0, vocab, (5,), generator=gen)  # a row that leaves its loop a while
    wants = [-lz_penalty(seq[:, prompt:t], vocab, window, buffer) for t in range(prompt + 1, prompt + steps + 1)]
    fixed = seq.clone()
    fixed[0, -3] = (fixed[0, -3] + 1) % vocab
    others = [fixed, fixed[:, :50], fixed[:, :51], fixed[:2]]
    others_want = [-lz_penalty(ids[:, prompt:], vocab, window, buffer) for ids in others]
    calls = []
    fresh = lz_incremental.lz_match_lengths  # where the tracker looks it up
    monkeypatch.setattr(lz_incremental, "lz_match_lengths", lambda *a, **k: calls.append(1) or fresh(*a, **k))
    proc = LZPenaltyLogitsProcessor(1.0, window, buffer, prompt_length=prompt, incremental=True)
    scores = torch.zeros(rows, vocab)
    for t, want in zip(range(prompt + 1, prompt + steps + 1), wants):
        torch.testing.assert_close(proc(seq[:, :t], scores.clone()), want)  # in place: a fresh copy each call
    assert len(calls) == 1  # one fresh computation, then updates only
    # a corrected earlier token, a shorter prefix (PTP), another batch: recomputed, still exact
    for ids, want in zip(others, others_want):
        torch.testing.assert_close(proc(ids, scores[: len(ids)].clone()), want)
    assert len(calls) == 4
    # a decoder writing into one buffer: a correction made in place is noticed too
    buf = seq.clone()
    for t in (60, 61):  # after a fresh computation, then after an update step
        proc(buf[:, :t], scores.clone())
        buf[2, t - 3] = (buf[2, t - 3] + 1) % vocab
        torch.testing.assert_close(proc(buf[:, :t + 1], scores.clone()),
                                   -lz_penalty(buf[:, prompt:t + 1], vocab, window, buffer))


@pytest.mark.parametrize("window,buffer,period,prompt", [
    (16, 4, 3, 2),  # the window fills at 16 generated tokens; its 4 lead columns exist from 20 on
    (12, 8, 1, 9),  # one token repeated, prompt included: matches always reach out of the window
    (8, 20, 2, 0),  # B > W: the lead columns outnumber the window
    (300, 260, 5, 30),  # B >= 256: the mismatch depth no longer fits uint8
])
def test_processor_decode_across_the_window_edge_equals_definition(window, buffer, period, prompt):
    """A decode growing one token a call: before the window fills (padded lead columns), when it just
    fills (prompt columns ahead of it, which must not count as window tokens), and long after
    (the B older tokens read in place). Periodic text that continues through the prompt makes any
    match reaching past the window's first token visible."""
    gen = torch.Generator().manual_seed(window + buffer)
    vocab, rows = 12, 2
    steps = [1, 2, window - 1, window, window + 1, window + buffer - 1, window + buffer, window + buffer + 3]
    seq = periodic(rows, prompt + max(steps), period, vocab, gen)
    seq[1, prompt + window // 2] = (seq[1, prompt + window // 2] + 1) % vocab  # a glitch in one row
    proc = LZPenaltyLogitsProcessor(0.7, window, buffer, prompt_length=prompt)
    for n in steps:
        ids = seq[:, :prompt + n]
        scores = torch.randn(rows, vocab, generator=gen)
        got = proc(ids, scores.clone())
        for r in range(rows):
            want = scores[r] - 0.7 * brute_lz(ids[r, prompt:].tolist(), vocab, window, buffer).float()
            torch.testing.assert_close(got[r], want, msg=f"{n} generated tokens, row {r}")


def test_processor_per_row_prompt_length_and_include_prompt():
    gen = torch.Generator().manual_seed(4)
    vocab = 40
    ids = periodic(3, 30, 3, vocab, gen)
    starts = torch.tensor([0, 10, 29])
    scores = torch.randn(3, vocab, generator=gen)
    got = LZPenaltyLogitsProcessor(1.0, window=16, buffer=4, prompt_length=starts)(ids, scores.clone())
    for r, s in enumerate(starts.tolist()):
        want = scores[r] - brute_lz(ids[r, s:].tolist(), vocab, 16, 4).float()
        torch.testing.assert_close(got[r], want)
    # every column is prompt: untouched
    assert torch.equal(LZPenaltyLogitsProcessor(1.0, prompt_length=30)(ids, scores.clone()), scores)
    assert torch.equal(LZPenaltyLogitsProcessor(0.0)(ids, scores.clone()), scores)


def test_processor_bf16_and_ids_beyond_scores():
    ids = torch.tensor([[1, 2, 9, 1, 2]])
    scores = torch.zeros(1, 8, dtype=torch.bfloat16)  # id 9 exists in the embedding, not the head
    got = LZPenaltyLogitsProcessor(1.0, vocab_size=16)(ids, scores)
    want = -lz_penalty(ids, 16)[:, :8]
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=0)


def test_no_host_sync_and_static_shapes():
    """Meta tensors have no data: .item(), nonzero, unique or boolean indexing would raise here."""
    ids = torch.randint(0, 100, (4, 40)).to("meta")
    scores = torch.empty(4, 100, device="meta")
    for pl in (3, torch.tensor([3, 5, 0, 40])):
        assert LZPenaltyLogitsProcessor(0.15, 16, 4, prompt_length=pl)(ids, scores).shape == (4, 100)
    assert lz_penalty(ids, 100, 16, 4, lengths=torch.tensor([1, 2, 3, 4], device="meta")).shape == (4, 100)


class _HostReads(TorchDispatchMode):
    """Counts the ops that hand tensor contents to the host (a device synchronisation on a GPU)."""

    READS = {"aten::_local_scalar_dense", "aten::equal", "aten::is_nonzero", "aten::nonzero", "aten::item"}

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in self.READS:
            self.reads.append(func._schema.name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("variant", ["codelength", "closest_longest"])
def test_default_processor_reads_nothing_on_the_host_in_a_cpu_decode(variant):
    """The default processor, as a decode calls it on CPU (the context grows by one token a call, ids
    beyond the logits' width present), never reads tensor contents on the host; the opt-in tracker
    does (its extends-check), which shows the probe sees such reads."""
    gen = torch.Generator().manual_seed(5)
    ids = periodic(3, 60, 4, 40, gen)
    ids[1, 30] = 45  # an id the logits cannot hold
    counts = {}
    for incremental in (None, True):
        proc = LZPenaltyLogitsProcessor(0.5, 16, 4, prompt_length=2, variant=variant, incremental=incremental)
        with _HostReads() as probe:
            for t in range(20, 60):
                got = proc(ids[:, :t], torch.zeros(3, 40))
        counts[incremental] = len(probe.reads)
        torch.testing.assert_close(got, -0.5 * lz_penalty(ids[:, 2:59], 40, 16, 4, variant=variant))
    assert counts[None] == 0
    assert counts[True] > 0


class _MaxNumel(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.max = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.max = max(self.max, t.numel())
        return out


def test_nothing_of_size_vocab_times_window():
    rows, vocab, window, buffer = 2, 50_000, 512, 32
    ids = torch.randint(0, vocab, (rows, 600))
    scores = torch.randn(rows, vocab)
    proc = LZPenaltyLogitsProcessor(0.15, window, buffer)
    with _MaxNumel() as probe:
        proc(ids, scores)
    assert probe.max <= max(rows * vocab, rows * window * buffer)
    with _MaxNumel() as probe:
        lz_penalty(ids, vocab, window, buffer)
    assert probe.max <= max(rows * vocab, rows * window * buffer)


def greedy_loop(model, ids: torch.Tensor, steps: int, processors) -> torch.Tensor:
    for _ in range(steps):
        with torch.no_grad():
            logits = model(ids).logits[:, -1].float()
        ids = torch.cat([ids, processors(ids, logits).argmax(-1, keepdim=True)], dim=1)
    return ids


def test_inside_hf_generate():
    model = tiny_llama(vocab_size=64, seed=1)
    model.generation_config.eos_token_id = None  # run every step, like the manual loop
    prompt = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    kw = dict(max_new_tokens=24, do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(prompt))
    plain = model.generate(prompt, **kw)
    outs = {}
    for alpha in (0.0, 2.0):
        procs = LogitsProcessorList([LZPenaltyLogitsProcessor(alpha, window=16, buffer=4, prompt_length=5)])
        outs[alpha] = model.generate(prompt, logits_processor=procs, **kw)
        assert torch.equal(outs[alpha], greedy_loop(model, prompt, 24, procs))
    assert torch.equal(outs[0.0], plain)
    assert not torch.equal(outs[2.0], plain)

    def distinct(seq):  # a strong LZ penalty keeps greedy decoding away from loops
        return len(set(seq[5:].tolist()))

    assert sum(map(distinct, outs[2.0])) > sum(map(distinct, plain))


@pytest.mark.slow
@pytest.mark.parametrize("prompt_length", [3, torch.tensor([3, 5, 0, 30])])
def test_processor_compiles_to_one_graph(prompt_length):
    """``torch.compile(fullgraph=True)`` traces the default processor (no graph break: no host
    read, static shapes) and gives the eager result before, at and past the window's edge."""
    proc = LZPenaltyLogitsProcessor(0.5, 16, 4, prompt_length=prompt_length)
    compiled = torch.compile(proc.__call__, fullgraph=True, dynamic=False)
    gen = torch.Generator().manual_seed(6)
    for width in (10, 19, 40):
        ids = periodic(4, width, 3, 20, gen)
        ids[1, 2] = 45  # an id the logits cannot hold
        scores = torch.randn(4, 40, generator=gen)
        torch.testing.assert_close(compiled(ids, scores.clone()), proc(ids, scores.clone()))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_capture():
    """The default processor captured in a CUDA graph: each replay, over new ids in the captured
    buffers, gives what an eager call on fresh tensors gives and what the definition gives. The
    processor works in place, so the graph's output is its input buffer: the logits are copied in
    anew before every replay, and the expected values are computed on other tensors."""
    vocab, rows, window, buffer, alpha = 1000, 4, 64, 8, 0.15
    starts = torch.tensor([0, 5, 50, 99])
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(rows, vocab, generator=gen).cuda()  # the same logits every replay: only ids move
    proc = LZPenaltyLogitsProcessor(alpha, window, buffer, prompt_length=starts)
    ids, scores = torch.zeros(rows, 100, dtype=torch.long, device="cuda"), logits.clone()
    side = torch.cuda.Stream()  # warm up off the capture stream: the first call builds the cost tables
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        proc(ids, scores.clone())
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = proc(ids, scores)
    replays = []
    for period in (3, 7):  # repetitive ids of two periods: penalties that differ between the replays
        new = periodic(rows, 100, period, vocab, gen)
        ids.copy_(new)
        scores.copy_(logits)  # the replay subtracts in place from this buffer
        graph.replay()
        torch.cuda.synchronize()
        eager = LZPenaltyLogitsProcessor(alpha, window, buffer, prompt_length=starts)(new.cuda(), logits.clone())
        torch.testing.assert_close(out, eager)
        for r, s in enumerate(starts.tolist()):
            want = logits[r].cpu() - alpha * brute_lz(new[r, s:].tolist(), vocab, window, buffer).float()
            torch.testing.assert_close(out[r].cpu(), want, atol=1e-5, rtol=1e-5)  # the device's log2
        replays.append(out.clone())
    assert not torch.equal(replays[0], replays[1])


def test_benchmark_script_runs_in_the_default_environment():
    """``benchmarks/lz_penalty.py`` end to end at a small size; it must not tune the process (malloc)."""
    import subprocess
    import sys

    from tests.helpers.scripts import ROOT

    script = ROOT / "benchmarks" / "lz_penalty.py"
    assert "mallopt" not in script.read_text()
    out = subprocess.run([sys.executable, str(script), "--vocab", "2000", "--batch", "2", "--window", "64", "--buffer",
                          "8", "--steps", "4", "--rounds", "1", "--direct-vocab", "500", "--direct-steps", "1",
                          "--threads", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith(("random", "repetitive"))]
    assert len(rows) == 2 and all(float(r[4]) > 0 for r in rows)  # the processor / sub_ ratio


# ---- the closest_longest variant (the later reference penalizer) ---------------------------------
def brute_closest_longest(context: list[int], vocab: int, window: int, buffer: int) -> torch.Tensor:
    """Its definition, literally: window = the last W tokens t_0..t_{m-1}; for each candidate v, the
    occurrences j >= B (0-based) with t_j = v, match length L_j = 1 + the common suffix (at most B)
    of t_0..t_{j-1} and of the whole window; the longest, then the closest (D = m - j); cost log2 D."""
    t = list(context[-window:])
    m = len(t)
    log_v = math.log2(vocab)
    best: dict[int, tuple[int, int]] = {}  # v -> (L, D) with the largest L, then the smallest D
    for j in range(buffer, m):
        s = 0
        while s < buffer and t[j - 1 - s] == t[m - 1 - s]:
            s += 1
        key = (s + 1, m - j)
        old = best.get(t[j])
        if old is None or key[0] > old[0] or (key[0] == old[0] and key[1] < old[1]):
            best[t[j]] = key
    out = torch.zeros(vocab, dtype=torch.float64)
    for v, (_, dist) in best.items():
        out[v] = log_v - min(max(math.log2(dist), 0.0), log_v)
    return out


def test_closest_longest_worked_example():
    # window 1 2 3 1 2 3 1 2, B = 2: the last two tokens "1 2" recur before 3 (j = 2 and j = 5, L = 3);
    # the closest is j = 5, D = 8 - 5 = 3: penalty log2 16 - log2 3. Token 1 occurs at j = 3 and 6
    # after "2 3", which ends unlike the window (L = 1): the closest, j = 6, D = 2. Token 2 (j = 4, 7),
    # L = 1, closest j = 7, D = 1: cost 0, the full log2 16 = 4.
    p = lz_penalty(torch.tensor([1, 2, 3, 1, 2, 3, 1, 2]), 16, window=512, buffer=2, variant="closest_longest")
    assert abs(p[3].item() - (4 - math.log2(3))) < 1e-5
    assert abs(p[1].item() - 3.0) < 1e-5 and abs(p[2].item() - 4.0) < 1e-5
    assert torch.count_nonzero(p).item() == 3
    # a window of at most B tokens: no penalty at all (the reference's w <= n case)
    assert lz_penalty(torch.tensor([4, 4]), 16, buffer=2, variant="closest_longest").abs().sum() == 0


@pytest.mark.parametrize("vocab,window,buffer,length,rows,period", [
    (3, 8, 4, 30, 4, 0), (3, 64, 32, 30, 8, 0), (17, 16, 1, 50, 8, 3), (17, 512, 32, 200, 4, 7),
    (1000, 50, 8, 120, 2, 5), (50_000, 64, 32, 40, 4, 0),
])
def test_closest_longest_matches_definition(vocab, window, buffer, length, rows, period):
    gen = torch.Generator().manual_seed(vocab + window + length)
    ctx = periodic(rows, length, period, vocab, gen) if period else torch.randint(0, min(vocab, 4), (rows, length), generator=gen)
    got = lz_penalty(ctx, vocab, window, buffer, variant="closest_longest")
    for r in range(rows):
        torch.testing.assert_close(got[r], brute_closest_longest(ctx[r].tolist(), vocab, window, buffer).float(),
                                   atol=1e-5, rtol=1e-5)
    # left padding (lengths) drops the pad columns: the same as the unpadded rows
    lengths = torch.tensor([length - 3 * (r % 3) for r in range(rows)])
    padded = lz_penalty(ctx, vocab, window, buffer, lengths=lengths, variant="closest_longest")
    for r in range(rows):
        want = brute_closest_longest(ctx[r, length - int(lengths[r]):].tolist(), vocab, window, buffer).float()
        torch.testing.assert_close(padded[r], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("incremental", [False, True])
def test_closest_longest_processor_in_a_decode_loop(incremental):
    gen = torch.Generator().manual_seed(9)
    rows, vocab, prompt, alpha = 3, 20, 4, 0.5
    seq = periodic(rows, prompt + 60, 5, vocab, gen)
    seq[1, 30:36] = torch.randint(0, vocab, (6,), generator=gen)
    proc = LZPenaltyLogitsProcessor(alpha, 16, 4, prompt_length=prompt, incremental=incremental,
                                    variant="closest_longest", inplace=False)
    scores = torch.randn(rows, vocab, generator=gen)
    for t in range(prompt + 1, prompt + 61):
        want = torch.stack([scores[r] - alpha * brute_closest_longest(seq[r, prompt:t].tolist(), vocab, 16, 4).float()
                            for r in range(rows)])
        torch.testing.assert_close(proc(seq[:, :t], scores), want, atol=1e-5, rtol=1e-5)


def test_variant_is_validated_and_reaches_the_sampler():
    from rpt.sampling import SamplingConfig, build_logits_processors

    with pytest.raises(ValueError, match="LZ variant='lz78'"):
        lz_penalty(torch.tensor([1, 2]), 4, variant="lz78")
    with pytest.raises(ValueError, match="SamplingConfig.lz_variant"):
        SamplingConfig(lz_variant="lz78")
    cfg = SamplingConfig(lz_penalty=0.15, lz_variant="closest_longest")
    procs = build_logits_processors(cfg, prompt_length=0, vocab_size=32)
    assert [p.variant for p in procs if isinstance(p, LZPenaltyLogitsProcessor)] == ["closest_longest"]


# ---- one class per variant, over one matcher -------------------------------------------------


@pytest.mark.parametrize("variant, cls, oracle", [
    ("codelength", LZPenaltyLogitsProcessor, brute_lz),
    ("closest_longest", ClosestLongestLZLogitsProcessor, brute_closest_longest),
])
@pytest.mark.parametrize("incremental", [None, True])
def test_each_variant_class_matches_its_brute_force_oracle(variant, cls, oracle, incremental):
    """The shared name builds the variant's class; built directly, each class penalises a decode's
    logits by alpha times its own oracle, for a batch of 2 rows that grow one token a call."""
    assert type(LZPenaltyLogitsProcessor(0.5, variant=variant)) is cls
    assert isinstance(cls(0.5), LZPenaltyLogitsProcessor) and cls(0.5).variant == variant
    assert type(cls(0.5)) is cls
    gen = torch.Generator().manual_seed(11)
    vocab, window, buffer = 12, 10, 3
    ids = periodic(2, 30, 3, vocab, gen)
    proc = cls(0.5, window, buffer, prompt_length=1, incremental=incremental)
    for t in range(2, 30):
        got = proc(ids[:, :t], torch.zeros(2, vocab))
        want = torch.stack([oracle(ids[r, 1:t].tolist(), vocab, window, buffer) for r in range(2)])
        torch.testing.assert_close(got, (-0.5 * want).float(), atol=1e-5, rtol=0)


def test_default_variant_is_codelength_and_a_class_keeps_its_variant():
    assert type(LZPenaltyLogitsProcessor(0.15)) is LZPenaltyLogitsProcessor
    with pytest.raises(ValueError, match="is the closest_longest variant"):
        ClosestLongestLZLogitsProcessor(0.15, variant="codelength")
    with pytest.raises(ValueError, match="LZ variant='lz78'"):
        LZPenaltyLogitsProcessor(0.15, variant="lz78")
