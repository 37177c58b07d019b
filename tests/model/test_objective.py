import math

import pytest
import torch

from rpt.model.objective import (
    IGNORE_INDEX,
    expected_swaps,
    make_rpt_batch,
    ntp_batch,
    offset_to_row,
    permutation_from_mask,
    sample_swap_start_mask,
    sample_swap_starts,
    window_permutation,
)


def reference_sigma_tau(length, starts, window):
    """Eqs. 9-10 applied literally, one start at a time (independent of the vectorised code)."""
    sigma = list(range(1, length + 1))
    for k in starts:
        i = k - 1
        sigma[i : i + window] = list(range(k + 1, k + window)) + [k]
    tau = []
    seen = set()
    for i, s in enumerate(sigma, start=1):
        seen.add(s)
        if seen == set(range(1, i + 1)):
            tau.append(i + 1)
        else:
            # eq. 10: the target is the pushed token k, the one index of 1..i not yet seen.
            (missing,) = set(range(1, i + 1)) - seen
            tau.append(missing)
    return sigma, tau


def test_paper_fig2_window2():
    sigma, tau = window_permutation(8, [3], 2)
    assert sigma.tolist() == [1, 2, 4, 3, 5, 6, 7, 8]
    assert (tau - sigma).tolist() == [1, 1, -1, 2, 1, 1, 1, 1]


def test_issue_example_window3():
    sigma, tau = window_permutation(8, [3], 3)
    assert sigma.tolist() == [1, 2, 4, 5, 3, 6, 7, 8]
    assert (tau - sigma).tolist() == [1, 1, -1, -2, 3, 1, 1, 1]


@pytest.mark.parametrize("window", [2, 3, 4])
def test_properties_on_random_draws(window):
    g = torch.Generator().manual_seed(window)
    for _ in range(200):
        length = int(torch.randint(window + 1, 60, (), generator=g))
        starts = sample_swap_starts(length, window, q=0.3, generator=g)
        # windows never overlap and never run past the end, and the first index never moves
        assert all(b - a >= window for a, b in zip(starts, starts[1:]))
        assert all(2 <= k and k + window - 1 <= length for k in starts)
        sigma, tau = window_permutation(length, starts, window)
        assert sorted(sigma.tolist()) == list(range(1, length + 1))
        ref_sigma, ref_tau = reference_sigma_tau(length, starts, window)
        assert sigma.tolist() == ref_sigma
        assert tau.tolist() == ref_tau
        allowed = {1, window} | {-l for l in range(1, window)}
        assert set((tau - sigma).tolist()) <= allowed
        assert sigma[0] == 1


def test_vectorised_permutation_matches_per_row():
    g = torch.Generator().manual_seed(1)
    mask = sample_swap_start_mask(16, 40, 3, q=0.25, generator=g)
    sigma, tau = permutation_from_mask(mask, 3)
    for b in range(16):
        starts = (torch.nonzero(mask[b]).flatten() + 1).tolist()
        s_ref, t_ref = window_permutation(40, starts, 3)
        assert torch.equal(sigma[b], s_ref) and torch.equal(tau[b], t_ref)


def test_expected_swaps_matches_paper_and_procedure():
    # The paper's Sec. 5.1: ~80 expected swaps for n=4096, q=0.02, w=3.
    exact = expected_swaps(4096, 3, 0.02)
    assert 75 < exact < 85
    assert exact == pytest.approx(4095 / (2 + 1 / 0.02), rel=0.01)
    # The literal loop and the vectorised sampler both agree with the exact expectation.
    g = torch.Generator().manual_seed(0)
    loop_counts = [len(sample_swap_starts(4096, 3, 0.02, g)) for _ in range(150)]
    vec_counts = sample_swap_start_mask(4000, 4096, 3, 0.02, generator=g).sum(1).double()
    sd = math.sqrt(exact)  # roughly Poisson
    assert abs(sum(loop_counts) / len(loop_counts) - exact) < 4 * sd / math.sqrt(150)
    assert abs(vec_counts.mean().item() - exact) < 4 * sd / math.sqrt(4000)


def test_vectorised_sampler_distribution_matches_loop_on_short_sequences():
    # Full distribution of the start pattern, not just the mean: length 7, w=2, q=0.4.
    g = torch.Generator().manual_seed(3)
    n = 20000
    vec = sample_swap_start_mask(n, 7, 2, 0.4, generator=g)
    vec_patterns = {}
    for row in vec.tolist():
        key = tuple(i + 1 for i, v in enumerate(row) if v)
        vec_patterns[key] = vec_patterns.get(key, 0) + 1
    loop_patterns = {}
    for _ in range(n):
        key = tuple(sample_swap_starts(7, 2, 0.4, g))
        loop_patterns[key] = loop_patterns.get(key, 0) + 1
    for key in set(vec_patterns) | set(loop_patterns):
        p1, p2 = vec_patterns.get(key, 0) / n, loop_patterns.get(key, 0) / n
        assert abs(p1 - p2) < 0.015, (key, p1, p2)


def test_make_rpt_batch_inputs_labels_and_kinds():
    x = torch.arange(100, 109).unsqueeze(0)  # 9 tokens: x_1..x_9 = 100..108
    g = torch.Generator().manual_seed(0)
    # q=1, s=1, w=3 on 8 fed tokens: starts at 2 and 5 (the first index never moves).
    batch = make_rpt_batch(x, window=3, s=1.0, q=1.0, generator=g, num_inputs=8)
    sigma = batch.position_ids[0] + 1
    assert sigma.tolist() == [1, 3, 4, 2, 6, 7, 5, 8]
    assert batch.input_ids[0].tolist() == [100 + s - 1 for s in sigma.tolist()]
    # labels: x_tau; tau = [2, 2, 2, 5, 5, 5, 8, 9]
    assert batch.labels[0].tolist() == [101, 101, 101, 104, 104, 104, 107, 108]
    assert batch.offset_ids[0].tolist() == [0, 1, 2, 3, 1, 2, 3, 0]
    assert batch.kinds[0].tolist() == [0, 1, 2, 0, 1, 2, 0, 0]


def test_make_rpt_batch_without_num_inputs_has_no_last_target():
    x = torch.arange(10).view(2, 5)
    batch = make_rpt_batch(x, window=2, s=0.0, q=0.5)
    assert batch.labels[:, -1].tolist() == [IGNORE_INDEX, IGNORE_INDEX]
    assert torch.equal(batch.input_ids, x)


def test_s_zero_is_ntp_and_matches_ntp_batch():
    x = torch.randint(0, 50, (4, 33))
    batch = make_rpt_batch(x, window=3, s=0.0, q=0.9, num_inputs=32)
    ref = ntp_batch(x, num_inputs=32)
    for name in ("input_ids", "position_ids", "offset_ids", "labels", "kinds"):
        assert torch.equal(getattr(batch, name), getattr(ref, name)), name
    assert torch.equal(batch.labels, x[:, 1:])


def test_s_controls_fraction_of_permuted_rows():
    x = torch.zeros(4000, 20, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    batch = make_rpt_batch(x, window=2, s=0.5, q=1.0, generator=g)
    permuted = (batch.offset_ids != 0).any(1).float().mean().item()
    assert abs(permuted - 0.5) < 0.04


def test_offset_to_row():
    off = torch.tensor([1, -1, -2, 3])
    assert offset_to_row(off, 3).tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(window=1, s=0.5, q=0.1), "window"),
        (dict(window=3, s=1.5, q=0.1), "s must"),
        (dict(window=3, s=0.5, q=-0.1), "q must"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_rpt_batch(torch.zeros(1, 10, dtype=torch.long), **kwargs)


def test_sequence_shorter_than_window():
    with pytest.raises(ValueError, match="shorter than the window"):
        make_rpt_batch(torch.zeros(1, 2, dtype=torch.long), window=3, s=0.5, q=0.1)
    with pytest.raises(ValueError, match="shorter than the window"):
        window_permutation(2, [], 3)


def test_overlapping_or_out_of_range_starts_rejected():
    with pytest.raises(ValueError, match="overlap"):
        window_permutation(10, [2, 3], 2)
    with pytest.raises(ValueError, match="must lie in"):
        window_permutation(10, [9], 3)
