"""No host read inside a training step between logs: the step's results stay on the device until a log,
evaluation or save reads them, so the host keeps queueing work ahead of the GPU.

Counted on the CPU as tests/sampling/decode/test_decode_host_work.py counts a decode's: the operations that read a value
back (``item`` / ``bool`` / ``int`` through ``_local_scalar_dense``, ``nonzero``, ``masked_select``, boolean
indexing) and the transfers that dispatch nothing on the CPU (``tolist``, ``cpu``, ``numpy``, patched),
inside every ``rpt.training.step.train_step`` of a whole run. Two reads per forward were there before: the
offsets' range check, and transformers' check of the all-ones attention mask (rpt/model/no_padding_mask.py).
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import rpt.training.loop
from tests.helpers.inprocess_train import train_main
from tests.helpers.train_helpers import write_config


class HostReads(TorchDispatchMode):
    READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
             torch.ops.aten.masked_select.default}

    def __init__(self):
        super().__init__()
        self.reads, self.active = 0, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        by_mask = func is torch.ops.aten.index.Tensor and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1])
        self.reads += func in self.READS or by_mask
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self.active = True
        return super().__enter__()

    def __exit__(self, *exc):
        self.active = False
        return super().__exit__(*exc)


@pytest.fixture
def counted(monkeypatch):
    """Host reads inside the training steps and inside the NaN check of a run, by function."""
    reads = {"train_step": HostReads(), "stop_if_not_finite": HostReads()}
    calls = dict.fromkeys(reads, 0)
    for name in reads:
        real = getattr(rpt.training.loop, name)

        def counting(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            with reads[_name]:
                return _real(*args, **kwargs)

        monkeypatch.setattr(rpt.training.loop, name, counting)
    for method in ("tolist", "cpu", "numpy"):  # transfers that dispatch nothing on the CPU
        real = getattr(torch.Tensor, method)

        def transfer(self, *args, _real=real, **kwargs):
            for r in reads.values():
                r.reads += r.active
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, method, transfer)
    return reads, calls


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))  # one tokenizer and token store for both runs


@pytest.mark.parametrize("objective", ["rpt", "ntp"])
def test_no_host_read_inside_a_training_step_between_logs(tmp_path, counted, objective, cache):
    """Three steps of two micro-batches each between logs: no read in any step; the counter sees the
    NaN check's one read at the log (the only place a step's result is read)."""
    reads, calls = counted
    cfg = write_config(tmp_path, objective=objective, max_steps=3, log_every=3, eval_batches=0, save_every=100,
                       global_batch_size=8, micro_batch_size=4, cache_dir=cache)
    assert train_main(cfg) == 0
    assert calls == {"train_step": 3, "stop_if_not_finite": 1}
    assert reads["train_step"].reads == 0
    assert reads["stop_if_not_finite"].reads == 1
