"""``train.py`` run inside the test process (no interpreter start-up: a micro run takes about a
second), with accelerate's process-wide state reset between runs."""

import os
import sys

from tests.helpers.train_helpers import ROOT


def train_main(config: str, *overrides: str) -> int:
    """``train.main`` on ``config`` with ``overrides``; its exit status."""
    from accelerate.state import AcceleratorState, GradientState, PartialState

    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    environ = dict(os.environ)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import train

    try:
        return train.main(["--config", config, *overrides])
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        PartialState._reset_state()
        os.environ.clear()  # what accelerate and the run set for themselves does not leak into later tests
        os.environ.update(environ)


def one_error_line(stderr: str) -> str:
    """The single ``error: ...`` line a refused invocation printed (asserts there is exactly one and no traceback)."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, stderr
    return lines[0]
