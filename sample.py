"""Sample from an RPT checkpoint (or a plain causal LM with ``--rpt-iters 0``).

    python sample.py --checkpoint runs/tiny/final --prompt "def fib(n):" --rpt-iters 1 --max-new-tokens 64
    python sample.py --checkpoint DIR --prompts prompts.jsonl --output out.jsonl --batch-size 8
    accelerate launch sample.py --checkpoint DIR --prompts prompts.jsonl --output out.jsonl

``--prompts`` is JSON Lines: ``{"prompt": "...", "id": ...}`` per line (``id`` optional; the line's
0-based index otherwise). A single prompt streams its completion to stdout as tokens become final;
several prompts print (or, with ``--output``, atomically write) one JSON object per prompt in
input order: ``id``, ``prompt``, ``completion`` (cut at the first stop string), ``finish_reason``
(``eos``, ``stop``, ``length``), ``new_tokens``. A stats line (tokens/s, model calls per token,
corrections) ends the run on stderr. Under ``accelerate launch`` the prompts are split across
processes and the main process writes the merged output. Bad input is one ``error: ...`` line and
exit status 2. Every sampling knob is a flag (``--help``). With ``--seed S`` prompt i's random draws
are keyed by a hash of ``(S, i)`` (the same text whatever the batch size or process count; seeds S and
S + 1 share no draws); ``--compile`` compiles the decode steps (``torch.compile``, fixed shapes).
``--chat`` applies the tokenizer's chat template to each prompt (one user turn, with the generation
prompt) for instruction-tuned models; a tokenizer without one is refused.
"""

from __future__ import annotations

import sys

from rpt.cli import sample as command


def build_parser():
    return command.build_parser(__doc__)


def main(argv: list[str] | None = None) -> int:
    return command.main(argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
