"""A 10x larger local corpus (about 1.2M -> 12M tokens) must not raise the training process's
peak memory by more than 64 MB, nor prepare_data.py's by more than 256 MB (several minutes)."""

import pytest

from benchmarks.data_memory import measure


@pytest.mark.slow
def test_memory_does_not_grow_with_the_corpus(tmp_path):
    results = measure(str(tmp_path), tokens=1_200_000, scale=10, num_procs=[1, 2])
    small, large = results["small"], results["large"]
    assert large["tokens"] >= 9 * small["tokens"] >= 9_000_000
    assert large["train_peak_mb"] - small["train_peak_mb"] <= 64, results
    for n in (1, 2):
        assert large[f"prepare_{n}"]["peak_mb"] - small[f"prepare_{n}"]["peak_mb"] <= 256, results
