"""A resumed run trains on the data the uninterrupted run would have: streamed with background
workers across an epoch boundary (the same loss at every step), and a token store resumed with
another world size (it continues at ``data_position``: no sample read twice, none skipped)."""

import os
import shutil

import pytest
import torch

from rpt.data.packed import StoreBatches
from rpt.training.measure.metrics import read_metrics
from tests.helpers.train_helpers import (
    ROOT,
    accelerate_cmd,
    free_port,
    run_cmd,
    run_train,
    write_config,
    write_jsonl,
)

CPU_DDP = os.path.join(ROOT, "configs/accelerate/cpu_ddp.yaml")


def rows(run_dir) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(os.path.join(run_dir, "metrics.jsonl")) if "loss" in r}


def worker_epochs(checkpoint, rank: int = 0) -> list[int]:
    state = torch.load(os.path.join(checkpoint, "data_state", f"rank-{rank}.pt"), weights_only=True)
    workers = state["loader"]["_snapshot"]["_worker_snapshots"].values()
    return [int(w["dataset_state"]["epoch"]) for w in workers]


def streamed_config(tmp_path, docs: int):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", [f"def f{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(docs)])
    return write_config(tmp_path, data={"path": corpus, "streaming": True}, val_fraction=0.0, eval_batches=0,
                        data_workers=2, micro_batch_size=2, log_every=1, warmup_steps=2,
                        tokenizer={"train_bpe": {"vocab_size": 280}})


def interrupted_copy(ref_dir, cut_dir, step: int) -> None:
    """The state of the run had it been killed right after checkpoint-``step`` (its metrics rows
    past ``step`` included: the resumed run must drop them)."""
    os.makedirs(cut_dir)
    shutil.copytree(ref_dir / f"checkpoint-{step}", cut_dir / f"checkpoint-{step}")
    shutil.copy(ref_dir / "metrics.jsonl", cut_dir / "metrics.jsonl")


def assert_same_losses(ref_dir, cut_dir, steps: int):
    a, b = rows(ref_dir), rows(cut_dir)
    assert sorted(b) == list(range(1, steps + 1))
    for step in range(1, steps + 1):
        assert b[step]["loss"] == pytest.approx(a[step]["loss"], rel=1e-6, abs=0), step


# slow (12 s, two trainings): a streamed resume with two workers past an epoch stays in the default suite
# through test_data_order.py's test_resume_continues_exactly, a trained resume through test_training.py's
# test_killed_run_resumes_exactly
@pytest.mark.slow
def test_streamed_two_workers_resume_after_epoch_boundary_same_losses(tmp_path):
    cfg = streamed_config(tmp_path, docs=30)
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    r = run_train(cfg, f"output_dir={ref}", "max_steps=14", "save_every=10", "keep_last=5")
    assert r.returncode == 0, r.stderr[-3000:]
    assert min(worker_epochs(ref / "checkpoint-10")) >= 1  # every worker is past its first epoch
    interrupted_copy(ref, cut, 10)
    resumed = run_train(cfg, f"output_dir={cut}", "max_steps=14", "save_every=10")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    assert_same_losses(ref, cut, 14)


@pytest.mark.slow
def test_streamed_two_processes_two_workers_resume_before_epoch_boundary(tmp_path):
    cfg = streamed_config(tmp_path, docs=60)
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    r = run_cmd(accelerate_cmd(CPU_DDP, free_port(), cfg, f"output_dir={ref}", "max_steps=12", "save_every=4", "keep_last=5"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert max(worker_epochs(ref / "checkpoint-4", rank=1)) == 0  # cut before the boundary ...
    assert min(worker_epochs(ref / "checkpoint-12", rank=1)) >= 1  # ... the run goes on across it
    interrupted_copy(ref, cut, 4)
    r = run_cmd(accelerate_cmd(CPU_DDP, free_port(), cfg, f"output_dir={cut}", "max_steps=12", "save_every=4"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert_same_losses(ref, cut, 12)


def test_store_resumed_with_another_batch_reads_every_sample_once():
    """2 ranks x 2 steps, then 1 rank (batch 4 -> 2) and then 3 ranks with accumulation 2 (-> 12):
    the samples read are 0, 1, 2, ... each once, whatever the geometry (brute force)."""

    class Indices:  # a PackedStore stand-in that returns the sample indices themselves
        def rows(self, samples):
            return torch.tensor(list(samples))

    read, step, position = [], 0, 0
    for world, accum, steps in ((2, 1, 2), (1, 1, 3), (3, 2, 2)):
        batches = StoreBatches(Indices(), micro_batch_size=2, global_batch=2 * accum * world)
        batches.resume_at(step, position)
        for t in range(step + 1, step + steps + 1):
            read += [int(i) for m in range(accum * world) for i in batches.micro_batch(t, m)]
        step, position = step + steps, position + steps * 2 * accum * world
    assert read == list(range(len(read))) and position == len(read)


@pytest.mark.slow
def test_store_two_processes_then_one_continues_at_data_position(tmp_path):
    cfg = write_config(tmp_path, eval_batches=0, micro_batch_size=2, log_every=1)
    run_dir = tmp_path / "run"
    r = run_cmd(accelerate_cmd(CPU_DDP, free_port(), cfg, f"output_dir={run_dir}", "max_steps=2", "save_every=2"))
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_train(cfg, f"output_dir={run_dir}", "max_steps=4", "resume=auto")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "continuing at sample 8" in r.stdout
    positions = [rows(run_dir)[s]["data_position"] for s in (1, 2, 3, 4)]
    assert positions == [4, 8, 10, 12]  # never backwards: 2 x 2 per step, then 2 per step


def test_a_resume_over_a_changed_corpus_is_refused_naming_both_keys(tmp_path, capsys):
    """A checkpoint records the tokens its data_position counts in (trainer_state.json ``data_key``). The
    corpus rewritten since (its token store prepared again, of other tokens): the resume is one line naming
    both keys and the fixes, and writes nothing; the corpus restored: it resumes. A checkpoint written
    before checkpoints recorded the key (or streamed data, which has none) resumes as before."""
    import json

    from rpt.training.run_dir.resume import Start, check_same_data
    from tests.helpers.inprocess_train import one_error_line, train_main

    texts = [f"def f{i}(x):\n    return x * {i} + {i % 7}\n" * 3 for i in range(40)]
    corpus = write_jsonl(tmp_path / "corpus.jsonl", texts)
    shutil.copy2(corpus, tmp_path / "original.jsonl")
    cfg = write_config(tmp_path, data={"path": corpus}, val_fraction=0.0, eval_batches=0, max_steps=2, save_every=2,
                       tokenizer={"train_bpe": {"vocab_size": 280}})
    run = tmp_path / "run"
    assert train_main(cfg) == 0
    key = json.loads((run / "checkpoint-2" / "trainer_state.json").read_text())["data_key"]
    write_jsonl(corpus, [t.replace("return", "yield") for t in texts])
    capsys.readouterr()
    metrics = (run / "metrics.jsonl").read_bytes()
    assert train_main(cfg, "max_steps=4") == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"trained on token data {key}" in line and "the training data is now " in line
    assert "restore the corpus" in line and "new output_dir" in line and "data_position 8" in line
    assert not (run / "checkpoint-4").exists() and (run / "metrics.jsonl").read_bytes() == metrics
    shutil.copy2(tmp_path / "original.jsonl", corpus)  # the corpus as it was
    assert train_main(cfg, "max_steps=4") == 0 and (run / "checkpoint-4").is_dir()
    state = json.loads((run / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["data_key"] == key
    del state["data_key"]  # as written before checkpoints recorded it: no check
    check_same_data(Start(str(run / "checkpoint-4"), state), "another", None)
