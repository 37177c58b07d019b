"""MBPP+ (EvalPlus): generate with a checkpoint (or take given completions), run them in the sandbox, report pass@k.

    python eval/mbpp.py --completions canonical --out runs/eval/mbpp_canonical.json
    python eval/mbpp.py --checkpoint runs/demo/rpt/final --rpt-iters 0 1 2 --temperatures 0 0.05 0.1
    python eval/mbpp.py --completions samples.jsonl --k 1 10 --out runs/eval/mbpp.json

The 378 MBPP+ tasks from the EvalPlus data (``--data-dir``, default ``$RPT_EVALPLUS_DIR`` or
``../shared/data/evalplus``), scored with EvalPlus semantics (see ``rpt/evaluation/evalplus_scoring.py``):
``pass@k`` is "base + extra tests", ``base`` / ``plus`` hold both side by side.

Prompt format (EvalPlus's, for base models): the task's prompt, a docstring with the problem
statement and one example assertion that names the function, stripped, plus a newline; the model
writes the function; generation stops at EvalPlus's stop strings (``\\n\"\"\"``, ``\\nassert``,
``\\nif __name__``, ``\\nprint(``, ...); the program run is prompt + completion.

Same flags, outputs (``F.samples.jsonl`` included) and resume as ``eval/humaneval.py``; ``--chat``
as there.
"""

from __future__ import annotations

import sys

from rpt.evaluation.benchmark_script import run
from rpt.evaluation.code_benchmarks import MBPPPlus


def main(argv: list[str] | None = None) -> int:
    return run(MBPPPlus(__doc__), argv)


if __name__ == "__main__":
    sys.exit(main())
