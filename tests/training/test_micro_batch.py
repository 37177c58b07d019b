"""``micro_batch_size: auto`` and ``global_batch_size`` (rpt/training/micro_batch.py): the search steps down on
out-of-memory errors, the split keeps the global batch, another split trains the same, a resume may
change the split but not the batch, and contradicting settings are one line."""

import json
import os

import pytest
import torch

from rpt.model import RPTForCausalLM
from rpt.model.objective import make_rpt_batch
from rpt.training.config import ConfigError, TrainConfig, load_config
from rpt.training.deepspeed_settings import check_deepspeed_batch
from rpt.training.measure.metrics import read_metrics
from rpt.training.micro_batch import (
    MAX_MICRO_BATCH,
    Split,
    choose,
    divisors,
    fixed_split,
    search,
    searched,
    start_from_probes,
)
from rpt.training.step import LEGACY_DRAWS, make_batch, trial_step
from tests.helpers.inprocess_train import one_error_line, train_main
from tests.helpers.tiny_models import tiny_llama
from tests.helpers.train_helpers import write_config

GIB = 2**30


def oom(message="CUDA out of memory. Tried to allocate 2.00 GiB"):
    return torch.OutOfMemoryError(message)


@pytest.fixture
def no_cache_clearing(monkeypatch):
    """accelerate's search empties the device cache (a full garbage collection) around every try: worth it
    on a GPU, ~1 s per try in a test process that holds transformers."""
    import accelerate.utils.memory

    monkeypatch.setattr(accelerate.utils.memory, "clear_device_cache", lambda garbage_collection=False: None)


def test_search_steps_down_the_divisors_on_an_injected_out_of_memory_error(no_cache_clearing):
    """Micro-batches above 7 run out of memory: the search tries 24, 12, 8 and settles on 6, the largest
    divisor of the process's 24 sequences that fits (accelerate's find_executable_batch_size)."""
    def fits(micro):
        if micro > 7:
            raise oom()

    assert search(24, fits, start=24) == (6, [24, 12, 8, 6])
    assert search(24, fits, start=10) == (6, [8, 6])  # from an upper bound: the divisors below it
    with pytest.raises(ConfigError, match="even one sequence"):
        search(24, lambda micro: (_ for _ in ()).throw(oom()), start=24)
    with pytest.raises(ValueError, match="not memory"):  # anything else is not a reason to step down
        search(24, lambda micro: (_ for _ in ()).throw(ValueError("not memory")), start=24)


class FakeDevice:
    """A device whose trial peak is 2 GiB + 1.5 GiB per sequence and that runs out of memory at 20 GiB."""

    def __init__(self):
        self.device = "fake:0"
        self.micro = None

    def budget(self):
        return int(0.9 * 24 * GIB)

    def peak(self, run):
        run()
        peak = int((2 + 1.5 * self.micro) * GIB)
        if peak > 20 * GIB:
            raise oom()
        return peak

    def release(self):
        pass


def test_search_on_a_device_probes_twice_then_steps_down_from_the_bound(no_cache_clearing):
    """Trial peaks at 1 and 2 sequences give 1.5 GiB per sequence; with 0.5 GiB of optimizer state the
    21.1 GiB budget holds 12 sequences (20 GiB): 16 is over it, 12 of 48 is the split (accumulation 4)."""
    device, tried = FakeDevice(), []

    def trial(micro):
        device.micro = micro
        tried.append(micro)

    split = searched(48, trial, device, extra=GIB // 2)
    assert (split.micro, split.accum) == (12, 4)
    assert tried == [1, 2, 12]  # the bound from the probes is 13: its largest divisor, 12, fits at once
    assert "searched on fake:0" in split.how and "20.00 GiB" in split.how
    assert start_from_probes(48, 3 * GIB, int(4.5 * GIB), int(21.1 * GIB)) == 13


def test_divisors_up_to_a_cap_match_brute_force():
    for n in range(1, 130):
        for cap in (None, 1, 2, 5, 11, 12, 64, 500):
            assert divisors(n, cap) == [d for d in range(n, 0, -1) if n % d == 0 and (cap is None or d <= cap)]


@pytest.mark.parametrize("share", [10**15, 2**50, 10**12 + 39, 2**61 - 1])
def test_auto_with_a_huge_global_batch_is_bounded_and_says_what_it_considered(share, no_cache_clearing):
    """Before: the divisors of the share were listed one by one (no answer in 75 s for 10**15)."""
    import time

    model = RPTForCausalLM.from_base(tiny_llama(), window=3)
    cfg = TrainConfig(model="x", data="x", seq_len=32, global_batch_size=share, micro_batch_size="auto")
    t0 = time.perf_counter()
    split = choose(cfg, 1, model, torch.device("cpu"), False, trial=None, reduce_min=lambda m: m)
    assert split.micro * split.accum == share and split.micro <= MAX_MICRO_BATCH and share % split.micro == 0
    assert f"up to {MAX_MICRO_BATCH} (the cap on an automatic micro-batch)" in split.how
    device, tried = FakeDevice(), []

    def trial(micro):
        device.micro = micro
        tried.append(micro)

    found = searched(share, trial, device, extra=GIB // 2)  # the search on a device: the same cap
    assert found.micro <= 12 and share % found.micro == 0 and f"tried {', '.join(map(str, tried[2:]))}" in found.how
    assert time.perf_counter() - t0 < 5


def test_trial_step_leaves_no_gradient_and_no_trace_in_the_random_streams():
    model = RPTForCausalLM.from_base(tiny_llama(), window=3).train()
    cfg = TrainConfig(model="x", data="x", seq_len=16, window=3, q=0.2)
    state = torch.get_rng_state()
    trial_step(model, cfg, 3, torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), state)
    assert all(p.grad is None for p in model.parameters())


def test_every_rank_takes_the_smallest_micro_batch_and_the_cpu_says_it_estimates():
    model = RPTForCausalLM.from_base(tiny_llama(), window=3)
    cfg = TrainConfig(model="x", data="x", seq_len=32, global_batch_size=24, micro_batch_size="auto")
    alone = choose(cfg, 2, model, torch.device("cpu"), False, trial=None, reduce_min=lambda m: m)
    assert (alone.micro, alone.accum) == (12, 1) and alone.how.startswith("the CPU has no out-of-memory error")
    other_rank_holds_4 = choose(cfg, 2, model, torch.device("cpu"), False, trial=None, reduce_min=lambda m: min(m, 4))
    assert (other_rank_holds_4.micro, other_rank_holds_4.accum) == (4, 3) and "smallest over the ranks" in other_rank_holds_4.how
    assert choose(TrainConfig(model="x", data="x", micro_batch_size=4, grad_accum=2), 3, model, torch.device("cpu"),
                  False, None, None) == Split(4, 2)


@pytest.mark.parametrize("keys, world, match", [
    ({"global_batch_size": 16, "micro_batch_size": 4, "grad_accum": 2}, 1, r"'grad_accum' = 2 contradicts global_batch_size 16"),
    ({"global_batch_size": 16, "micro_batch_size": 8}, 3, r"'global_batch_size' = 16 does not split over 3 processes"),
    ({"global_batch_size": 12, "micro_batch_size": 8}, 1, r"'global_batch_size' = 12 is invalid: it is not a multiple"),
    ({"micro_batch_size": "auto"}, 1, r"auto needs global_batch_size"),
    ({"micro_batch_size": "auto", "global_batch_size": 16, "grad_accum": 2}, 1, r"'grad_accum' = 2 is invalid: .* auto chooses"),
])
def test_contradicting_batch_keys_are_refused(tmp_path, keys, world, match):
    with pytest.raises(ConfigError, match=match):
        fixed_split(load_config(write_config(tmp_path, **keys)), world)
    assert fixed_split(load_config(write_config(tmp_path, global_batch_size=16, micro_batch_size=4)), 2) == Split(4, 2)
    assert divisors(12) == [12, 6, 4, 3, 2, 1]


def test_deepspeeds_own_micro_batch_is_refused_where_the_run_chooses_it():
    cfg = TrainConfig(model="x", data="x", global_batch_size=64, micro_batch_size="auto")
    check_deepspeed_batch({"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto"}, cfg)
    with pytest.raises(ConfigError, match=r"sets train_micro_batch_size_per_gpu=4 but micro_batch_size is auto"):
        check_deepspeed_batch({"train_micro_batch_size_per_gpu": 4}, cfg)
    with pytest.raises(ConfigError, match=r"sets train_batch_size=32 but global_batch_size is 64"):
        check_deepspeed_batch({"train_batch_size": 32}, cfg)


def test_the_objectives_draws_are_keyed_per_sequence_of_the_global_batch():
    """A global batch of 8 sequences split 1 x 8, 2 x 4 or 8 x 1 gets the same permutations row for row;
    the keying of runs started before (per global micro-batch) is the one they were trained with."""
    cfg = TrainConfig(model="x", data="x", seq_len=64, window=3, s=0.5, q=0.2, seed=3)
    rows = torch.randint(0, 97, (8, 65), generator=torch.Generator().manual_seed(0))
    whole = make_batch(cfg, rows, 5, 0)
    for micro in (4, 1):
        parts = [make_batch(cfg, rows[j * micro:(j + 1) * micro], 5, j) for j in range(8 // micro)]
        for name in ("input_ids", "position_ids", "offset_ids", "labels", "kinds"):
            assert torch.equal(torch.cat([getattr(p, name) for p in parts]), getattr(whole, name)), (micro, name)
    assert (whole.position_ids != torch.arange(64)).any(dim=1).sum() >= 2  # rows were permuted
    legacy = make_batch(cfg, rows[4:], 5, 1, draws=LEGACY_DRAWS)
    generator = torch.Generator().manual_seed((3 * 1_000_003 + 5) * 10_007 + 1)  # (seed, step, micro-batch)
    assert torch.equal(legacy.position_ids, make_rpt_batch(rows[4:], 3, 0.5, 0.2, generator, 64).position_ids)


def losses(run) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(os.path.join(run, "metrics.jsonl")) if "loss" in r}


FAST = dict(max_steps=4, save_every=2, keep_last=5, eval_batches=0, schedule="constant", warmup_steps=1,
            global_batch_size=8, micro_batch_size=4)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One tokenizer and token store for the module's runs (they train on the same data)."""
    return str(tmp_path_factory.mktemp("cache"))


def test_two_splits_of_one_global_batch_train_the_same_and_a_resume_may_change_the_split(tmp_path, capsys, cache):
    """Global batch 8: micro-batch 4 x accumulation 2, and auto (8 x 1 on the CPU), give the same losses;
    an auto run cut at checkpoint 2 resumed with micro-batch 2 x 4 (a smaller device) continues with
    them, and records each split; a resume that would change the global batch is one line."""
    cfg = write_config(tmp_path, **FAST, cache_dir=cache)
    assert train_main(cfg, f"output_dir={tmp_path / 'a'}") == 0
    assert train_main(cfg, f"output_dir={tmp_path / 'auto'}", "micro_batch_size=auto") == 0
    assert "micro-batch: auto -> 8, accumulation 1 (the CPU has no out-of-memory error" in capsys.readouterr().out
    a, auto = losses(tmp_path / "a"), losses(tmp_path / "auto")
    assert sorted(a) == sorted(auto) == [1, 2, 3, 4]
    for step in a:
        assert auto[step] == pytest.approx(a[step], rel=1e-5), step
    assert train_main(cfg, f"output_dir={tmp_path / 'cut'}", "max_steps=2", "micro_batch_size=auto") == 0
    assert train_main(cfg, f"output_dir={tmp_path / 'cut'}", "micro_batch_size=2") == 0
    cut = losses(tmp_path / "cut")
    for step in (3, 4):
        assert cut[step] == pytest.approx(a[step], rel=1e-5), step
    segments = [json.loads(line) for line in (tmp_path / "cut" / "segments.jsonl").read_text().splitlines()]
    assert [(s["micro_batch_size"], s["grad_accum"], s["draws"]) for s in segments] == [(8, 1, "sequence"), (2, 4, "sequence")]
    assert segments[1]["changed"]["micro_batch_size"] == {"from": "auto", "to": 2}
    assert segments[0]["micro_batch_choice"].startswith("the CPU has no") and segments[1]["micro_batch_choice"] is None
    state = json.loads((tmp_path / "auto" / "checkpoint-4" / "trainer_state.json").read_text())
    assert (state["micro_batch_size"], state["grad_accum"], state["global_batch"]) == (8, 1, 8)
    capsys.readouterr()
    assert train_main(cfg, f"output_dir={tmp_path / 'cut'}", "max_steps=6", "global_batch_size=4", "micro_batch_size=2") == 2
    assert "trained 8 sequences per step; global_batch_size (8 -> 4)" in one_error_line(capsys.readouterr().err)


def test_a_run_keyed_per_micro_batch_resumes_with_its_keying_and_its_split(tmp_path, capsys, monkeypatch, cache):
    """A run whose checkpoints do not say how its draws were keyed (written before) resumes keyed per
    micro-batch, exactly; changing its micro-batch (it would change the permutations) is refused."""
    import rpt.training.loop

    cfg = write_config(tmp_path, **{**FAST, "global_batch_size": None, "grad_accum": 2}, cache_dir=cache)
    real = Split.record

    def as_before(split, draws):
        record = real(split, draws)
        for key in ("micro_batch_size", "grad_accum", "micro_batch_choice", "draws"):
            record.pop(key)
        return record

    monkeypatch.setattr(rpt.training.loop, "DRAWS", LEGACY_DRAWS)
    monkeypatch.setattr(Split, "record", as_before)
    assert train_main(cfg, f"output_dir={tmp_path / 'old'}") == 0
    assert train_main(cfg, f"output_dir={tmp_path / 'cut'}", "max_steps=2") == 0
    monkeypatch.undo()
    assert "draws" not in json.loads((tmp_path / "cut" / "checkpoint-2" / "trainer_state.json").read_text())
    capsys.readouterr()
    assert train_main(cfg, f"output_dir={tmp_path / 'cut'}", "micro_batch_size=2", "grad_accum=4") == 2
    line = one_error_line(capsys.readouterr().err)
    assert "keys the objective's permutations per micro-batch" in line and "micro_batch_size (4 -> 2)" in line
    assert train_main(cfg, f"output_dir={tmp_path / 'cut'}") == 0
    old, cut = losses(tmp_path / "old"), losses(tmp_path / "cut")
    for step in (3, 4):
        assert cut[step] == pytest.approx(old[step], rel=1e-6), step
    segments = [json.loads(line) for line in (tmp_path / "cut" / "segments.jsonl").read_text().splitlines()]
    assert segments[-1]["draws"] == LEGACY_DRAWS


def test_tiny_config_states_its_global_batch_and_auto_refuses_a_fixed_accumulation(capsys):
    cfg = load_config("configs/tiny.yaml", ["micro_batch_size=auto"])
    assert (cfg.global_batch_size, cfg.micro_batch_size, cfg.grad_accum) == (16, "auto", None)
    assert train_main("configs/tiny.yaml", "micro_batch_size=auto", "grad_accum=2") == 2
    assert "'grad_accum' = 2 is invalid" in one_error_line(capsys.readouterr().err)


def test_the_config_names_the_keying_a_new_run_trains_with_and_a_resume_keeps_its_own(tmp_path, capsys, monkeypatch, cache):
    """``draws: micro_batch`` trains a new run exactly as a trainer whose default keying is per micro-batch
    (its losses, bit for bit) and records it; a resume with ``draws`` unset continues with the
    checkpoint's keying, and one naming another keying is refused in one line."""
    import rpt.training.loop

    cfg = write_config(tmp_path, **{**FAST, "global_batch_size": None, "grad_accum": 2, "max_steps": 2}, cache_dir=cache)
    assert train_main(cfg, f"output_dir={tmp_path / 'keyed'}", f"draws={LEGACY_DRAWS}") == 0
    monkeypatch.setattr(rpt.training.loop, "DRAWS", LEGACY_DRAWS)  # a trainer whose default keying is per micro-batch
    assert train_main(cfg, f"output_dir={tmp_path / 'old'}") == 0
    monkeypatch.undo()
    assert losses(tmp_path / "keyed") == losses(tmp_path / "old")  # bit for bit
    assert json.loads((tmp_path / "keyed" / "checkpoint-2" / "trainer_state.json").read_text())["draws"] == LEGACY_DRAWS
    capsys.readouterr()
    assert train_main(cfg, f"output_dir={tmp_path / 'keyed'}", "max_steps=3", "draws=sequence") == 2
    line = one_error_line(capsys.readouterr().err)
    assert "config key 'draws' = 'sequence'" in line and "keyed the objective's draws per micro_batch" in line
    assert train_main(cfg, f"output_dir={tmp_path / 'keyed'}", "max_steps=3") == 0
    segments = [json.loads(line) for line in (tmp_path / "keyed" / "segments.jsonl").read_text().splitlines()]
    assert [s["draws"] for s in segments] == [LEGACY_DRAWS, LEGACY_DRAWS]
    import yaml

    assert yaml.safe_load((tmp_path / "keyed" / "final" / "training_config.yaml").read_text())["draws"] == LEGACY_DRAWS
