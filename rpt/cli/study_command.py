"""The shape a study's command (``eval/agreement.py``, ``eval/scaling.py``) has once its arguments are read:
the output checked before any work, the study run, a refusal (a pre-registration not kept) one error line,
the results written and their report printed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rpt.cli.output_paths import output_problem
from rpt.cli.parser import report_input_error
from rpt.errors import InputError


def refuse(problem: str) -> int:
    """``error: <problem>`` on stderr; the exit code, 2."""
    return report_input_error(InputError(problem), traceback_hint=False)


def run_study(out: str, siblings: Sequence[str], run: Callable[[], Any], write: Callable[[str, Any], Sequence[Path]],
              refused: type[Exception], check: Callable[[], str | None] = lambda: None) -> int:
    """``--out`` (and the files ``siblings`` names beside it) checked, then ``check()`` (the study's own last
    check: a problem or None), before ``run()``; ``refused`` raised by ``run`` is one error line (exit 2); else
    ``write(out, summary)`` writes the JSON, the markdown report (printed) and the rest, and their paths are
    printed."""
    problem = output_problem(out, "--out", siblings=siblings) or check()
    if problem is not None:
        return refuse(problem)
    try:
        summary = run()
    except refused as e:
        return refuse(str(e))
    paths = write(out, summary)
    print(Path(paths[1]).read_text(encoding="utf-8"))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
