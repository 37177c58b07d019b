"""What a compiled decode does outside its compiled step, and what the step reads (``generate(compile=...)``).

The host work per step is counted, not timed: tensor operations dispatched outside the compiled region
(a ``TorchDispatchMode`` switched off inside every ``torch.compile``'d call), and device-to-host
transfer points (``tolist`` / ``cpu`` / ``numpy``, which dispatch nothing on the CPU, patched at the
Python level; ``item`` / ``bool`` / ``int``, nonzero, masked_select and boolean indexing, seen as the
operations they dispatch). Per step is the *difference* between a 64-token and a 32-token decode in
the same capacity bucket, over 32 steps: the prefill, the eager first and last steps and the final
read-out cancel. The truth for "the same count" is the other depth and batch size.

The storage test records, through a compile backend, the address of every tensor a compiled step's
graph receives at every call (parameters, KV cache, decode state, block patterns): it fails if any is
reallocated between steps or between two decodes of the same bucket.

The backend is dynamo's ``eager`` (traces the step as inductor would, ``fullgraph=True``, and runs it
op by op): the counts are about what runs outside the region, so its kernels do not matter.
"""

import functools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from transformers import LlamaConfig, LlamaForCausalLM

from rpt.model import RPTForCausalLM
from rpt.sampling import SamplingConfig, generate, generate_reference
from rpt.sampling.decode import compile_mode as step_compile
from rpt.sampling.decode import ntp_path, rpt_path
from rpt.sampling.decode.buffers import pooled, release_decode_buffers
from tests.sampling.decode.test_decoder import V

WIDTH = 40  # prompts 40 wide: 32 and 64 new tokens share the 128-column capacity bucket
MAX_OPS_PER_STEP = 20


def rpt_llama(layers: int, seed: int = 0) -> RPTForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.4)
    cfg._attn_implementation = "sdpa"
    model = RPTForCausalLM.from_base(LlamaForCausalLM(cfg).eval(), window=2).eval()
    model.lm.generation_config.eos_token_id = None  # a random model has no real EOS
    return model


@pytest.fixture(scope="module")
def models():
    models = {layers: rpt_llama(layers) for layers in (2, 8)}
    yield models
    for model in models.values():
        release_decode_buffers(model)


@pytest.fixture(autouse=True)
def fresh_buffers(models):
    """Each test builds its compiled steps anew (under its own patches): no pooled entry carries over."""
    for model in models.values():
        release_decode_buffers(model)
    torch._dynamo.reset()


def ragged(batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, V, (batch, WIDTH), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1::2, :3] = 0  # every other row left-padded
    return ids, mask


class HostWork(TorchDispatchMode):
    """Counts operations dispatched and device-to-host transfer points, outside compiled calls."""

    SYNCING = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
               torch.ops.aten.masked_select.default}

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.transfers = 0
        self.inside = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        index_by_mask = func is torch.ops.aten.index.Tensor and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1])
        self.transfers += func in self.SYNCING or index_by_mask
        return func(*args, **(kwargs or {}))


@pytest.fixture
def host_work(monkeypatch):
    """A :class:`HostWork` to enter around a decode: every ``torch.compile``'d function built meanwhile runs
    with the mode switched off (it counts what the host does outside the compiled region)."""
    work = HostWork()
    real_compile = torch.compile

    def counting_compile(fn, **kw):
        compiled = real_compile(fn, **kw)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            work.inside += 1
            try:
                with _disable_current_modes():
                    return compiled(*args, **kwargs)
            finally:
                work.inside -= 1
        return call

    monkeypatch.setattr(torch, "compile", counting_compile)
    for name in ("tolist", "cpu", "numpy"):  # transfers that dispatch nothing on the CPU
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, **kwargs):
            work.transfers += not work.inside
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return work


def count(model, ids, mask, cfg, work: HostWork) -> tuple[int, int, torch.Tensor]:
    before = work.ops, work.transfers
    with work:
        out = generate(model, ids, cfg, attention_mask=mask, compile="eager")
    return work.ops - before[0], work.transfers - before[1], out.sequences


def per_step_work(model, work: HostWork, rpt_iters: int, batch: int) -> tuple[float, float]:
    """(operations, transfers) per step outside the compiled step, NTP or RPT k = 1 (greedy; confidence 1,
    so that nothing is corrected and every step is a common one); checks the compiled tokens too."""
    ids, mask = ragged(batch, seed=batch)
    runs = {}
    for new in (64, 32, 64):  # the first decode builds the bucket's buffers and compiles its step
        cfg = SamplingConfig(max_new_tokens=new, rpt_iters=rpt_iters, rpt_window=2, confidence=1.0, eos_token_id=[])
        runs[new] = count(model, ids, mask, cfg, work)
    assert torch.equal(runs[64][2], generate(model, ids, cfg, attention_mask=mask).sequences)
    assert torch.equal(runs[32][2], runs[64][2][:, : WIDTH + 32])
    return (runs[64][0] - runs[32][0]) / 32, (runs[64][1] - runs[32][1]) / 32


# NTP is slow (8 s): the counters and the queued-read path are the same code for both objectives, and
# NTP's several steps per read stay in the default suite through test_decode_paths.py
@pytest.mark.parametrize("rpt_iters", [pytest.param(0, marks=pytest.mark.slow), 1])
def test_host_work_per_compiled_step_is_small_and_independent_of_depth_and_batch(models, host_work, monkeypatch,
                                                                                   rpt_iters):
    """At most 20 operations and one transfer per step outside the compiled step, the same at 2 and 8
    layers (batch 1) and at batch 1 and 16 (2 layers) (three traces of the step); with 8 steps
    queued per read (CUDA's setting, given a CPU entry), NTP and RPT read the host once per 8 steps, and
    RPT at most 0.25 times per new token over a whole 64-token decode (the prompt's reading, the
    prefill, the hand-over at its last column and the read-out included)."""
    # depth at batch 1, batch at depth 2: each varies alone (8 layers at batch 16 would add the dearest trace)
    per_step = {(layers, batch): per_step_work(models[layers], host_work, rpt_iters, batch)
                for layers, batch in ((2, 1), (8, 1), (2, 16))}
    assert all(ops <= MAX_OPS_PER_STEP and transfers <= 1 for ops, transfers in per_step.values()), per_step
    assert len(set(per_step.values())) == 1, per_step
    # the CUDA path (several steps queued per read) given a CPU entry: the graphs above serve it
    monkeypatch.setitem(step_compile.STEPS_PER_TRANSFER, "cpu", 8)
    ops, transfers = per_step_work(models[2], host_work, rpt_iters, 1)
    ids, mask = ragged(1, seed=1)
    cfg = SamplingConfig(max_new_tokens=64, rpt_iters=rpt_iters, rpt_window=2, confidence=1.0, eos_token_id=[])
    whole = count(models[2], ids, mask, cfg, host_work)[1] / 64  # every read of a decode, per new token
    assert transfers <= 1 / 8, (ops, transfers)
    assert rpt_iters == 0 or whole <= 0.25, whole  # RPT: 16 reads, 8 of them the queued steps' flags


def test_the_counters_see_host_work(models, host_work):
    """The counters are not blind: an eager decode (every operation outside any compiled region) counts
    far more than 20 operations per step, and more at 8 layers than at 2."""
    ids, mask = ragged(1)
    per_step = {}
    for layers in (2, 8):
        ops = []
        for new in (8, 16):
            before = host_work.ops, host_work.transfers
            with host_work:
                generate(models[layers], ids, SamplingConfig(max_new_tokens=new, eos_token_id=[]), attention_mask=mask)
            ops.append((host_work.ops - before[0], host_work.transfers - before[1]))
        per_step[layers] = ((ops[1][0] - ops[0][0]) / 8, (ops[1][1] - ops[0][1]) / 8)
    assert per_step[2][0] > MAX_OPS_PER_STEP and per_step[8][0] > per_step[2][0], per_step
    assert per_step[2][1] >= 1, per_step  # the eager NTP step reads its flags once per step


class Addresses:
    """A compile backend recording, at every call of a batch-flat step's graph, the addresses of the
    tensors it receives (dynamo lifts everything the step reads to graph inputs)."""

    def __init__(self):
        self.graphs = 0
        self.calls: list[tuple[int, tuple]] = []
        self.recording = False

    def __call__(self, gm, example_inputs):
        graph = self.graphs
        self.graphs += 1

        def run(*args):
            if self.recording:
                self.calls.append((graph, tuple(a.data_ptr() for a in args if isinstance(a, torch.Tensor))))
            return gm(*args)
        return run


@pytest.mark.parametrize("rpt_iters", [0, 1])
def test_every_tensor_the_compiled_step_reads_keeps_its_storage(models, monkeypatch, rpt_iters):
    """Two decodes of the same bucket (batch 3, prompts 40 and 37 wide, capacity 128), NTP or RPT k = 1
    sampled: every input of the step's graph has one address at every step of both decodes, and the
    second decode compiles nothing new (it borrows the first one's pooled buffers)."""
    torch._dynamo.reset()
    backend = Addresses()
    for step in (ntp_path.CompiledNTPStep, rpt_path.CompiledRPTStep):
        real = step.__call__

        def recording(self, *args, _real=real):
            backend.recording = True
            try:
                return _real(self, *args)
            finally:
                backend.recording = False

        monkeypatch.setattr(step, "__call__", recording)
    model = models[2]
    cfg = SamplingConfig(max_new_tokens=40, rpt_iters=rpt_iters, rpt_window=2, confidence=1.0, temperature=0.8,
                         top_k=8, repetition_penalty=1.2, lz_penalty=0.3, lz_window=16, eos_token_id=[], seed=4)
    graphs = []
    for width, seed in ((WIDTH, 1), (WIDTH - 3, 2)):
        ids, mask = ragged(3, seed)
        ids, mask = ids[:, :width], mask[:, :width]
        compiled = generate(model, ids, cfg, attention_mask=mask, compile=backend)
        assert torch.equal(compiled.sequences, generate_reference(model, ids, cfg, attention_mask=mask).sequences)
        graphs.append(backend.graphs)
    assert graphs[0] == graphs[1]  # nothing recompiled for the second decode
    steps = backend.calls
    assert len(steps) > 60, len(steps)  # both decodes' compiled steps were recorded
    by_graph: dict[int, set] = {}
    for graph, addresses in steps:
        by_graph.setdefault(graph, set()).add(addresses)
    assert all(len(seen) == 1 for seen in by_graph.values()), {g: len(s) for g, s in by_graph.items()}
    assert len(pooled(model)) >= 1


def test_the_storage_test_sees_a_reallocated_input(models, monkeypatch):
    """The address record fails when a step input is reallocated: the KV cache reallocated between two
    decodes (the pool switched off: each decode builds its own buffers) gives two address sets."""
    from rpt.sampling.decode import driver as decoder

    torch._dynamo.reset()
    backend = Addresses()
    real = ntp_path.CompiledNTPStep.__call__

    def recording(self, *args):
        backend.recording = True
        try:
            return real(self, *args)
        finally:
            backend.recording = False

    monkeypatch.setattr(ntp_path.CompiledNTPStep, "__call__", recording)
    monkeypatch.setattr(decoder, "borrow", lambda model, key, build: (build(), False))
    ids, mask = ragged(2)
    for _ in range(2):
        generate(models[2], ids, SamplingConfig(max_new_tokens=8, eos_token_id=[]), attention_mask=mask,
                 compile=backend)
    assert len({addresses for _, addresses in backend.calls}) > 1
