r"""A setting that several threads switch at once: set by the first to enter, restored by the last to leave.

A decode switches state that every caller shares -- a model's attention implementation (its configs),
dynamo's process-wide config on a torch whose ``config.patch`` is not thread-local -- for the length of
a call. Saved and restored by each caller, two overlapping calls restore in the wrong order: the second
saves the first's switched value and restores it last, so the state stays switched after both. Here the
switch is counted per key under a lock: the first entrant saves and sets, later ones only count, the last
to leave restores what the first saved. The cost is a lock taken twice per switch (well under a
microsecond), nothing per op.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import Any

_lock = threading.Lock()
_active: dict[Hashable, list] = {}  # key -> [callers inside, what the first one's ``switch`` returned]


@contextlib.contextmanager
def switched(key: Hashable, switch: Callable[[], Any], restore: Callable[[Any], None]) -> Iterator[None]:
    """Run the body with the setting ``key`` switched: ``switch()`` (returning what ``restore`` needs) runs
    when no other thread holds ``key`` switched, ``restore(saved)`` when the last one leaves. Every caller
    of one key must want the same switch (the key names the setting and its value)."""
    with _lock:
        entry = _active.get(key)
        if entry is None:
            entry = _active[key] = [0, switch()]
        entry[0] += 1
    try:
        yield
    finally:
        with _lock:
            entry[0] -= 1
            if entry[0] == 0:
                del _active[key]
                restore(entry[1])

