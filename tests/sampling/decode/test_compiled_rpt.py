"""The compiled common RPT step (``rpt/sampling/decode/rpt_path.py``): model call, NTP and PTP proposals with
their processors, and the event check in one fixed-shape ``torch.compile`` region.

Truths: the eager decoder and the uncached reference (whole decodes: tokens, finish reasons, calls,
corrections), and the eager proposals on growing contexts (for the rotated fixed-width ones). As in
``test_compiled_ntp.py``, ``backend="aot_eager"`` traces exactly what inductor would (``fullgraph=True``:
a graph break or host synchronisation is an error) and runs aten kernels, so equality is exact and
cheap; the tests of graph counts and flags, and the cases whose operations another case's include, run
the same traced graph on dynamo's ``eager`` backend (half the cost: no functionalisation); the inductor
run is ``@pytest.mark.slow``."""

import logging
import random

import pytest
import torch

from benchmarks.compile_widths import Messages
from rpt.sampling import SamplingConfig, generate, generate_reference
from rpt.sampling.decode import compile_mode as step_compile
from rpt.sampling.decode import ntp_path, rpt_path
from rpt.sampling.decode.contexts import GrowingContexts, RotatedContexts
from rpt.sampling.decode.proposal_layout import ProposalLayout
from rpt.sampling.proposals import Proposer, block_proposals
from tests.sampling.decode.test_compiled_ntp import random_config
from tests.sampling.decode.test_decoder import V, prompts, rpt_model


@pytest.fixture(scope="module")
def models():
    return {w: rpt_model(w).float() for w in (2, 3, 4)}


class StepCalls:
    """Counts the compiled step's calls (each is one common step that did not run eagerly)."""

    def __init__(self, monkeypatch):
        self.count = 0
        real = rpt_path.CompiledRPTStep.__call__

        def counted(step, *args):
            self.count += 1
            return real(step, *args)

        monkeypatch.setattr(rpt_path.CompiledRPTStep, "__call__", counted)


@pytest.mark.parametrize("case", range(24))
def test_block_proposals_on_rotated_contexts_equal_growing_ones(case):
    """Every proposal of a call (NTP with a guess at column n, the NTP re-proposal, PTP per lag, greedy or
    sampled, every penalty and both LZ variants, ragged rows) from the rotated ``[batch, capacity]``
    contexts equals the eager one from ``seqs[:, : c + 1]``."""
    rng = random.Random(case)
    cfg = random_config(rng, penalize_ptp=rng.random() < 0.7, rpt_iters=1, confidence=rng.choice([0.0, 0.3]))
    batch, width, capacity = rng.choice([1, 3]), rng.randrange(2, 10), 48
    pads = torch.tensor([rng.randrange(width) if rng.random() < 0.5 else 0 for _ in range(batch)])
    seqs = torch.randint(0, 6, (batch, capacity), generator=torch.Generator().manual_seed(case))  # repeats
    seqs[torch.arange(capacity) < pads[:, None]] = 0
    seeds = torch.tensor([rng.randrange(2**40) for _ in range(batch)])
    pad_length = pads if bool((pads > 0).any()) else None  # the eager decoder's conventions
    for n in sorted(rng.sample(range(width + 3, capacity - 1), 4)):
        seqs[:, n + 1:] = rng.randrange(V)  # past the end: never read
        lags = tuple(range(1, rng.randrange(1, 4)))
        keep_prev = rng.random() < 0.5
        logits = torch.randn(batch, 1 + keep_prev + len(lags), V, generator=torch.Generator().manual_seed(n)) * 3
        fed = torch.randint(0, V, (batch,), generator=torch.Generator().manual_seed(n + 1))
        its = torch.randint(0, 2, (len(lags), batch)) if lags else None
        growing = GrowingContexts(Proposer(cfg, width, seeds, pad_length=pad_length), seqs)
        rotated = RotatedContexts(cfg, seeds, seqs, torch.full_like(pads, width), pads)
        layout = ProposalLayout(growing.proposer.ntp_draws, True, keep_prev, lags)
        want = block_proposals(growing, logits.clone(), n, n - pads, fed, layout, its)
        got = block_proposals(rotated, logits.clone(), torch.tensor(n), n - pads, fed, layout, its)
        assert torch.equal(got, want), (n, lags, cfg)


def rpt_config(rng: random.Random, window: int, sampled: bool, eos, confidence: float, **kw) -> SamplingConfig:
    return SamplingConfig(
        max_new_tokens=rng.choice([6, 14]), rpt_iters=1 if sampled else rng.choice([1, 2]), rpt_window=window,
        temperature=0.9 if sampled else 0.0, top_k=rng.choice([0, 8]), seed=rng.randrange(1000),
        confidence=confidence, repetition_penalty=rng.choice([1.0, 1.3]),
        frequency_penalty=rng.choice([0.0, 0.5]), lz_penalty=rng.choice([0.0, 0.5]), lz_window=16,
        penalize_ptp=rng.random() < 0.5, eos_token_id=eos, **kw)


# batch: prompt lengths (ragged widths; 1- and 2-token prompts under a 3- or 4-wide window, whose lags
# reach into the prompt at the first positions)
LENGTHS = {1: (6,), 2: (1, 4), 3: (9, 5, 7), 4: (2, 7, 4, 1),
           16: (3, 9, 5, 7, 4, 8, 6, 2, 9, 5, 3, 7, 6, 4, 8, 9)}


@pytest.mark.parametrize(("window", "sampled", "batch"), [
    (2, False, 1), (3, True, 2), (4, False, 4), (4, True, 3),
    pytest.param(2, False, 16, marks=pytest.mark.slow),  # the default-suite cases above keep the guarantee
])
def test_compiled_step_equals_eager_and_reference(models, monkeypatch, window, sampled, batch):
    """Greedy (k 1-2) and sampled (k = 1) RPT, windows 2-4, batch 1-4 (16, slow), corrections (confidence
    0.3 or 0.6), penalties (LZ included) at random, ragged widths and prompts shorter than the window,
    EOS or not, with four compiled steps queued per read of the flags (the CUDA path, given a CPU
    entry; the queue starts at one step and doubles): compiled == eager == reference in float32, with
    the same finish reasons, model calls and corrections (the steps queued past an event, which repeat
    its column, counted apart), and the compiled step ran."""
    case = 2 * window + sampled
    rng = random.Random(case)
    monkeypatch.setitem(step_compile.STEPS_PER_TRANSFER, "cpu", 4)
    ids, mask = prompts(batch, lengths=LENGTHS[batch], seed=case)
    model = models[window]
    free = generate(model, ids, SamplingConfig(max_new_tokens=8, eos_token_id=[]), attention_mask=mask)
    cfg = rpt_config(rng, window, sampled, eos=rng.choice([[], free.generated(0)[rng.randrange(2, 8)]]),
                     confidence=rng.choice([0.3, 0.6]))
    torch._dynamo.reset()
    eager = generate(model, ids, cfg, attention_mask=mask)
    calls = StepCalls(monkeypatch)
    # aot_eager's functionalisation for (2, greedy, k = 2, LZ) and (4, sampled, frequency + LZ), whose steps'
    # operations include the other two cases'; those trace with dynamo's eager backend (the same graph)
    backend = "aot_eager" if (window, sampled) in ((2, False), (4, True)) else "eager"
    compiled = generate(model, ids, cfg, attention_mask=mask, compile=backend)
    ref = generate_reference(model, ids, cfg, attention_mask=mask)
    assert torch.equal(compiled.sequences, eager.sequences) and torch.equal(compiled.sequences, ref.sequences), cfg
    assert compiled.finish_reasons == eager.finish_reasons
    for key in ("forward_passes", "corrections"):
        assert compiled.stats[key] == eager.stats[key], key
    assert calls.count > 0 or max(compiled.new_token_counts) <= 2


def test_a_long_decode_runs_one_graph_padded_or_not(models, monkeypatch):
    """A 60-token greedy decode with w = 3 and LZ + repetition penalties: every common step from the
    first position to the last column runs the one compiled graph (the whole window's lags at every
    column; nothing eager, no model-call graph beside it but the prefill's), and prompts of other widths in the same
    capacity bucket, padded or not, compile nothing new; dynamo prints no recompile message."""
    from torch._dynamo.utils import counters

    model = models[3]
    cfg = SamplingConfig(max_new_tokens=60, rpt_iters=1, rpt_window=3, confidence=1.0, repetition_penalty=1.2,
                         lz_penalty=0.3, lz_window=16, eos_token_id=[])  # confidence 1: nothing is accepted
    torch._dynamo.reset()
    counters.clear()
    messages, log = Messages(), logging.getLogger("torch._dynamo")
    log.addHandler(messages)
    calls = StepCalls(monkeypatch)
    graphs = []
    try:
        for lengths in ((12, 9), (11, 11), (10, 13)):  # (11, 11) unpadded
            ids, mask = prompts(2, lengths, seed=len(graphs))
            # dynamo's eager backend: the graphs, calls and recompiles counted are dynamo's, whatever runs
            # them (aot_eager's functionalisation of the step: test_compiled_step_equals_eager_and_reference)
            compiled = generate(model, ids, cfg, attention_mask=mask, compile="eager")
            assert torch.equal(compiled.sequences, generate(model, ids, cfg, attention_mask=mask).sequences)
            graphs.append(counters["stats"]["unique_graphs"])
    finally:
        log.removeHandler(messages)
    assert calls.count == 3 * 60  # columns W .. last of each decode
    # the first decode: the step's graph and its prefill's (more than 8 queries: the query bucket of 16);
    # the unpadded and the other padded decode add none
    assert graphs == [2, 2, 2], graphs
    assert not [m for m in messages.seen if "recompile" in m.lower()]


@pytest.mark.parametrize("rpt_iters", [0, 1])
def test_nan_logits_at_a_compiled_step_raise(monkeypatch, rpt_iters):
    """NaN logits first appearing at a compiled step (NTP's or RPT's, after the eager prefill) raise the
    decoder's error naming NaN, through the step's flags (no host read inside the step)."""
    model = rpt_model(2, seed=3).float()
    step = rpt_path.CompiledRPTStep if rpt_iters else ntp_path.CompiledNTPStep
    real, calls = step.__call__, []

    def poison_at_third_step(self, *args):
        calls.append(args[0])
        if len(calls) == 3:
            with torch.no_grad():
                model.lm.lm_head.weight[7, 0] = float("nan")
        return real(self, *args)

    monkeypatch.setattr(step, "__call__", poison_at_third_step)
    torch._dynamo.reset()
    ids, mask = prompts(2, seed=22)
    cfg = SamplingConfig(max_new_tokens=8, rpt_iters=rpt_iters, rpt_window=2, repetition_penalty=1.3)
    with pytest.raises(ValueError, match="NaN or inf"):  # the flags are the traced graph's: dynamo's eager runs it
        generate(model, ids, cfg, attention_mask=mask, compile="eager")
    assert len(calls) == 3


@pytest.mark.slow
def test_compiled_rpt_step_inductor():
    """The inductor backend: greedy (k = 2, corrections) and sampled (k = 1) RPT with LZ and repetition
    penalties equal the eager decode and the reference."""
    torch._dynamo.reset()
    model = rpt_model(3).float()
    ids, mask = torch.tensor([[3, 5, 7, 9] * 3, [11, 4, 6, 8, 3, 5] * 2]), None
    pen = dict(repetition_penalty=1.3, lz_penalty=2.0, lz_window=16, lz_include_prompt=True, eos_token_id=[],
               max_new_tokens=30, rpt_window=3, confidence=0.3, penalize_ptp=True)
    for cfg in (SamplingConfig(**pen, rpt_iters=2),
                SamplingConfig(**pen, rpt_iters=1, temperature=0.9, top_k=8, top_p=0.9, seed=2)):
        eager = generate(model, ids, cfg, attention_mask=mask)
        compiled = generate(model, ids, cfg, attention_mask=mask, compile="inductor")
        ref = generate_reference(model, ids, cfg, attention_mask=mask)
        assert torch.equal(compiled.sequences, eager.sequences) and torch.equal(compiled.sequences, ref.sequences)
        assert compiled.stats["corrections"] == eager.stats["corrections"]
