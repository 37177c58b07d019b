"""The degenerate-repetition detector against brute force and the naive regex it replaces."""

from __future__ import annotations

import random
import re
import time

import numpy as np
import pytest

from rpt.studies.repetition.metric import Repetition, degenerate_rate, find_repetition, is_degenerate


def random_text(rng: random.Random, plant: bool) -> str:
    alphabet = rng.choice(["a", "ab", "abc"])
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 90)))
    if plant:
        unit = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
        at = rng.randint(0, len(text))
        text = text[:at] + unit * rng.randint(15, 22) + text[at:]
    return text


@pytest.mark.parametrize("repeats", [3, 20])
def test_consecutive_mode_equals_the_naive_regex(repeats):
    rng = random.Random(repeats)
    naive = re.compile(r"(.+)\1{" + str(repeats - 1) + "}", re.DOTALL)
    for _ in range(1500):
        text = random_text(rng, plant=rng.random() < 0.4)
        assert is_degenerate(text, min_repeats=repeats) == bool(naive.search(text)), text


def brute_anywhere(tokens: list, min_len: int, repeats: int) -> bool:
    n = len(tokens)
    for length in range(min_len, n + 1):
        for start in range(n - length + 1):
            gram, count, pos = tokens[start:start + length], 0, 0
            while pos + length <= n:
                if tokens[pos:pos + length] == gram:
                    count, pos = count + 1, pos + length
                else:
                    pos += 1
            if count >= repeats:
                return True
    return False


@pytest.mark.parametrize("min_len", [1, 2, 3])
def test_anywhere_mode_equals_brute_force(min_len):
    rng = random.Random(min_len)
    for _ in range(300):
        tokens = [rng.randint(0, rng.choice([1, 2, 4])) for _ in range(rng.randint(0, 30))]
        assert is_degenerate(tokens, min_len=min_len, min_repeats=4, consecutive=False) == \
            brute_anywhere(tokens, min_len, 4), tokens


def test_twenty_repeats_is_the_threshold():
    loop = [101, 7, 42]
    prefix, suffix = list(range(200, 230)), list(range(300, 310))
    assert find_repetition(prefix + loop * 20 + suffix) == Repetition(start=30, length=3, repeats=20)
    assert find_repetition(prefix + loop * 19 + suffix) is None
    assert find_repetition(prefix + loop * 25) == Repetition(start=30, length=3, repeats=25)


def test_min_len_is_the_length_of_the_repeated_substring():
    assert is_degenerate("ab" * 20, min_len=2)
    assert not is_degenerate("ab" * 20, min_len=3)
    assert is_degenerate("a" * 40, min_len=2)  # "aa" twenty times
    assert not is_degenerate("a" * 39, min_len=2)
    assert find_repetition("xy" + "a" * 60, min_len=3) == Repetition(start=2, length=3, repeats=20)


def test_scattered_repeats_count_only_in_anywhere_mode():
    words = []
    for i in range(25):
        words += ["the", "cat", "sat", f"w{i}", f"v{i}"]
    assert not is_degenerate(words, min_len=3)
    assert find_repetition(words, min_len=3, consecutive=False) == Repetition(start=0, length=3, repeats=25)
    assert not is_degenerate(words, min_len=4, consecutive=False)


def test_accepts_token_ids_arrays_strings_and_words():
    ids = np.array([5] * 10 + [1, 2] * 20)
    assert find_repetition(ids) == Repetition(start=10, length=2, repeats=20)
    assert is_degenerate("I am. " * 20) and not is_degenerate("I am. " * 19)
    assert is_degenerate(["ok", "go"] * 20)
    assert not is_degenerate([])


def test_degenerate_rate():
    texts = ["abc" * 30, "the quick brown fox", "x" * 19, "no" * 21]
    assert degenerate_rate(texts) == 0.5
    assert degenerate_rate([]) == 0.0


def test_long_sequences_are_fast():
    rng = np.random.default_rng(0)
    clean = rng.integers(0, 50_000, 20_000)
    looped = np.concatenate([clean[:15_000], np.tile(clean[:37], 30)])
    start = time.perf_counter()
    assert find_repetition(clean) is None
    assert find_repetition(looped) == Repetition(start=15_000, length=37, repeats=30)
    assert find_repetition(clean, min_len=8, consecutive=False) is None
    assert time.perf_counter() - start < 2.0


def test_bad_parameters_are_rejected():
    with pytest.raises(ValueError):
        is_degenerate("abc", min_len=0)
    with pytest.raises(ValueError):
        is_degenerate("abc", min_repeats=1)
