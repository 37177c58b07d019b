"""The defaults that differ between entry points, and why: one table that ``--help`` texts and the tests read.

Every knob shared by ``sample.py``, ``eval/humaneval.py``, ``eval/mbpp.py``, ``eval/gsm8k.py`` and
``eval/table1.py`` (one ``argparse`` destination, or an alias in :data:`ALIASES`) has one default
everywhere, except the knobs of :data:`DIFFERENCES`: there each entry point's default is listed and
the reason is appended to the flag's ``--help`` (:func:`explain_defaults`). ``tests/sampling/test_entry_defaults.py``
parses every entry point's parser and fails on a difference this table does not state.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

SAMPLE = "sample.py"
HUMANEVAL, MBPP, GSM8K, TABLE1 = "eval/humaneval.py", "eval/mbpp.py", "eval/gsm8k.py", "eval/table1.py"
LM_EVAL_TASK = "eval/lm_eval_tasks/gsm8k_local.yaml"
BENCHMARKS = (HUMANEVAL, MBPP, GSM8K)
ENTRY_POINTS = (SAMPLE, *BENCHMARKS, TABLE1)


def _auto_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class Difference:
    """A knob whose default differs: ``defaults`` per entry point (a callable: computed where it runs)."""

    knob: str
    defaults: dict[str, object]
    why: str

    def default(self, entry: str) -> object:
        value = self.defaults[entry]
        return value() if callable(value) else value


DIFFERENCES = (
    Difference("token_healing", {SAMPLE: False, HUMANEVAL: True, MBPP: False, GSM8K: False},
               "token healing is on where a prompt ends inside a token the model would write: HumanEval's prompts "
               "end in a newline that BPE tokenizers merge with the next line's indentation. MBPP+ (the next line "
               "starts at column 0) and GSM8K (after 'Answer:') leave it off, and so do sample.py and "
               "custom_generate, which continue the prompt exactly as given, as transformers' generate does"),
    Difference("dtype", {SAMPLE: "auto", HUMANEVAL: "float32", MBPP: "float32", GSM8K: "float32", TABLE1: "float32"},
               "sample.py: auto (bfloat16 on CUDA, float32 on CPU) for speed; the evaluation scripts: float32, so "
               "a score is not moved by bfloat16 rounding (greedy decoding flips on near-ties) and runs on any "
               "device compare; --dtype auto or bfloat16 trades that for speed"),
    Difference("seed", {SAMPLE: None, HUMANEVAL: None, MBPP: None, GSM8K: None, TABLE1: 0},
               "sample.py without --seed draws afresh on every run (as transformers' generate); the evaluation "
               "scripts without --seed draw with seed 0 (eval/table1.py spells it 0), so a score is reproducible"),
    Difference("shots", {GSM8K: 8, TABLE1: 8, LM_EVAL_TASK: 5},
               "8 worked examples, the chain-of-thought convention (Wei et al. 2022; lm-eval's gsm8k_cot) of this "
               "prompt; the lm-eval task gsm8k_local keeps lm-eval's gsm8k task (5 shots, '#### N' answers) so its "
               "numbers compare with lm-eval's (--num_fewshot 8 there to match)"),
    Difference("rpt_iters", {SAMPLE: 0, HUMANEVAL: [0], MBPP: [0], GSM8K: [0], TABLE1: [0, 1, 2]},
               "eval/table1.py sweeps the paper's k = 0 1 2 and temperatures 0 0.05 0.1 (reproducing Table 1 is its "
               "purpose); the benchmark scripts run one greedy NTP setting unless given a sweep"),
    Difference("temperatures", {HUMANEVAL: [0.0], MBPP: [0.0], GSM8K: [0.0], TABLE1: [0.0, 0.05, 0.1]},
               "eval/table1.py sweeps the paper's temperatures; the benchmark scripts run greedy unless given a sweep"),
    Difference("device", {SAMPLE: None, HUMANEVAL: _auto_device, MBPP: _auto_device, GSM8K: _auto_device,
                          TABLE1: _auto_device},
               "the same rule everywhere, cuda when available, else cpu; sample.py settles it after parsing"),
    Difference("out", {HUMANEVAL: "runs/eval/humaneval.json", MBPP: "runs/eval/mbpp.json",
                       GSM8K: "runs/eval/gsm8k.json", TABLE1: "runs/table1"},
               "each script writes its own report"),
)
# The same knob under another flag name in one entry point: entry -> {its destination: the shared name}.
ALIASES = {TABLE1: {"gsm8k_data": "data", "evalplus_dir": "data_dir"}}


def explain_defaults(parser: argparse.ArgumentParser, entry: str) -> argparse.ArgumentParser:
    """Append to the ``--help`` of each of ``entry``'s flags in :data:`DIFFERENCES` why its default differs."""
    aliases = {shared: dest for dest, shared in ALIASES.get(entry, {}).items()}
    for difference in DIFFERENCES:
        if entry not in difference.defaults:
            continue
        dest = aliases.get(difference.knob, difference.knob)
        for action in parser._actions:
            if action.dest == dest:
                action.help = f"{action.help or ''} [default differs between entry points: {difference.why}]".strip()
    return parser
