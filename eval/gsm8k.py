"""GSM8K: generate k-shot chain-of-thought answers with a checkpoint (or take given ones) and score them.

    python eval/gsm8k.py --checkpoint runs/demo/rpt/final --data ../shared/data/gsm8k/test.jsonl \\
        --rpt-iters 0 1 2 --temperatures 0 0.05 0.1 --limit 200
    accelerate launch eval/gsm8k.py --checkpoint DIR --data test.jsonl --rpt-iters 0 1 2
    python eval/gsm8k.py --completions gold --data ../shared/data/gsm8k/test.jsonl
    python eval/gsm8k.py --completions answers.jsonl --data test.jsonl --out runs/eval/gsm8k.json

Without ``--data`` the split comes from the local copy (``$RPT_GSM8K_DIR``, else
``../shared/data/gsm8k`` beside the repository, as ``eval/table1.py`` and the lm-eval task read it),
and only where there is none from the hub (``openai/gsm8k``, needs network or a warm cache;
``--data hub`` asks for it).

``--checkpoint``: every problem gets the same ``--shots``-shot prompt (the first train problems,
from ``--train-data``, else ``train.jsonl`` beside the test file, else the hub's train split) and,
for every setting of the sweep (``--rpt-iters`` x ``--temperatures``), one answer that stops at
the next ``Question:``. Every flag of ``sample.py`` applies. ``F.json``: per setting
(``settings``) accuracy, decoding stats and ``results``; ``best_of_temperatures`` (per
``rpt_iters`` the best accuracy over temperatures, the paper's figure); and, for the first
setting, the top-level ``n``, ``accuracy`` and ``results`` (with the ``completion``). Generated
answers are kept in ``F.items.jsonl``, so rerunning on the same ``--out`` resumes.

``--completions``: ``gold`` or ``answers.jsonl`` with ``{"idx", "completion"}`` lines, ``idx``
indexing the evaluated split, one line per problem (a second line for an ``idx`` is refused); the
completion is what followed ``Answer:`` and is cut at the next ``Question:``. ``--limit N``: the
first N problems of the split (lines for later ones are counted, not scored). ``F.json``: ``n``,
``accuracy``, ``results`` in input order.

Both write ``F.md`` and ``F.png`` beside ``F.json``. ``--chat``: prompts through the tokenizer's
chat template, the shots as earlier turns.
"""

from __future__ import annotations

import sys

from rpt.evaluation.benchmark_script import run
from rpt.evaluation.gsm8k import GSM8K


def main(argv: list[str] | None = None) -> int:
    return run(GSM8K(__doc__), argv)


if __name__ == "__main__":
    sys.exit(main())
