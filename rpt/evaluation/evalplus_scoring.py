"""HumanEval+ and MBPP+ with EvalPlus semantics, scored outside the program's process.

Data: the EvalPlus release files (``HumanEvalPlus-v0.1.10.jsonl.gz``, ``MbppPlus-v0.2.0.jsonl.gz``)
from ``--data-dir`` / ``$RPT_EVALPLUS_DIR`` / ``../shared/data/evalplus`` beside the repository,
loaded with the ``evalplus`` package (``pip install -e '.[evalplus]'``; it reads them through
``HUMANEVAL_OVERRIDE_PATH`` / ``MBPP_OVERRIDE_PATH`` and restores MBPP+'s tuple / set / complex
inputs).

Semantics, as ``evalplus.evaluate`` (v0.3.1):

* expected outputs are the canonical solution's return values on ``base_input`` and
  ``plus_input`` (deep copies), computed once per data file and cached
  (``$RPT_CACHE_DIR`` or ``~/.cache/rpt/evalplus``), with each call's time; for MBPP's
  ``check_str``-like tasks only whether the output is not None;
* a completion passes a split when every call's output matches: ``==``, else for floats
  (``atol`` of the task, 1e-6 when it is 0 and the expected value is a float or a list of
  floats) the same type, the same length and ``np.allclose(out, exp, rtol=1e-7, atol=atol)``;
  EvalPlus's special oracles (HumanEval/32 ``find_zero``: ``|poly(xs, out)| <= atol``; MBPP's
  set-equality, not-None and recomputed-reference tasks) come from the ``evalplus`` package;
* time limit of call ``i``: ``max(1 s, 4 x`` the canonical solution's time``)``, the whole split
  at most 60 s;
* ``base`` passes when all base inputs pass; ``plus`` ("base + extra tests", the HumanEval+ /
  MBPP+ figure) when base and plus inputs all pass.

The program runs in the sandbox in ``calls`` mode: the child only returns values; the comparison
happens here, as the results arrive (the run stops at the first wrong one), and the per-call time
limits are enforced here, by when each result arrives.

MBPP+ prompt format (EvalPlus's, for base models): the task's ``prompt`` field, a docstring with
the problem statement and one example assertion that names the function::

    \"\"\"
    Write a function to find the shared elements from the given two lists.
    assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))
    \"\"\"

and the completion is the code that follows (the whole function, imports included); the program
run is ``prompt + completion``. Generation stops at EvalPlus's stop strings for direct
completion (:data:`STOP_SEQUENCES`).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from rpt.evaluation import samples_jsonl as samples
from rpt.evaluation.user_jsonl import EvalInputError
from rpt.result_files import write_atomic
from rpt.sandbox import Execution, Job, Limits, _wire, exit_reason, run_jobs

FILES = {"humaneval": "HumanEvalPlus-v0.1.10.jsonl.gz", "mbpp": "MbppPlus-v0.2.0.jsonl.gz"}
OVERRIDE_ENV = {"humaneval": "HUMANEVAL_OVERRIDE_PATH", "mbpp": "MBPP_OVERRIDE_PATH"}
MIN_TIME_LIMIT = 1.0  # evalplus.config.DEFAULT_MIN_TIME_LIMIT
TIME_LIMIT_FACTOR = 4.0  # evalplus.config.DEFAULT_GT_TIME_LIMIT_FACTOR
SPLIT_TIME_LIMIT = 60.0  # EVALPLUS_TIMEOUT_PER_TASK
CACHE_VERSION = 1
# EvalPlus's end-of-completion strings for base models (evalplus.provider.utility): its EOS list
# plus the dataset's extras.
_EOS = ("<|endoftext|>", "<|endofmask|>", "</s>", "\nif __name__", "\ndef main(", "\nprint(")
STOP_SEQUENCES = {"humaneval": (*_EOS, "\ndef ", "\nclass ", "\nimport ", "\nfrom ", "\nassert "),
                  "mbpp": (*_EOS, '\n"""', "\nassert")}
ROOT = Path(__file__).resolve().parents[2]
MBPP_PROMPT_FORMAT = ("EvalPlus direct completion: the task's prompt (a docstring with the problem statement and one "
                      "example assert naming the function), stripped, plus a newline; the completion is the code "
                      "that follows; the program is prompt + completion")


def mbpp_prompt(task: dict) -> str:
    """The generation prompt of an MBPP+ task (see :data:`MBPP_PROMPT_FORMAT`)."""
    return task["prompt"].strip() + "\n"


def data_dir(explicit: str | Path | None = None) -> Path:
    """Where the EvalPlus files are: ``explicit``, ``$RPT_EVALPLUS_DIR``, or ``../shared/data/evalplus``."""
    path = Path(explicit or os.environ.get("RPT_EVALPLUS_DIR") or ROOT.parent / "shared" / "data" / "evalplus")
    return path


def data_file(dataset: str, directory: str | Path | None = None) -> Path:
    path = data_dir(directory) / FILES[dataset]
    if not path.is_file():
        raise EvalInputError(f"{path}: EvalPlus data file not found; pass --data-dir DIR (the folder with "
                             f"{FILES[dataset]}) or set RPT_EVALPLUS_DIR")
    return path


def _evalplus():
    try:
        import evalplus.data  # noqa: F401
        import evalplus.eval
        from evalplus.eval import _special_oracle
    except ImportError as exc:
        raise EvalInputError(f"the evalplus package is needed for HumanEval+ / MBPP+ ({exc}); "
                             "install it with pip install -e '.[evalplus]'") from None
    return evalplus.eval, _special_oracle


def load_tasks(dataset: str, directory: str | Path | None = None) -> dict[str, dict]:
    """task_id -> task (``prompt``, ``entry_point``, ``canonical_solution``, ``base_input``,
    ``plus_input``, ``atol``), in file order, through evalplus's loader."""
    path = data_file(dataset, directory)
    _evalplus()
    import evalplus.data.humaneval as he_data
    import evalplus.data.mbpp as mbpp_data

    # evalplus reads the override variable once, at import: set the module's copy as well.
    module, attr = (he_data, "HUMANEVAL_OVERRIDE_PATH") if dataset == "humaneval" else (mbpp_data, "MBPP_OVERRIDE_PATH")
    previous = getattr(module, attr)
    setattr(module, attr, str(path))
    try:
        tasks = he_data.get_human_eval_plus() if dataset == "humaneval" else mbpp_data.get_mbpp_plus()
    except Exception as exc:  # a corrupt or hand-edited release file: evalplus's reader raises whatever it meets
        raise EvalInputError(f"{path}: evalplus cannot read it ({type(exc).__name__}: {str(exc)[:200]}); use the "
                             f"release file {FILES[dataset]} as published") from None
    finally:
        setattr(module, attr, previous)
    needed = ("prompt", "entry_point", "canonical_solution", "base_input", "plus_input", "atol")
    for task_id, task in tasks.items():
        missing = [key for key in needed if key not in task]
        if missing or not all(isinstance(task[k], str) for k in needed[:3]):
            raise EvalInputError(f"{path}: task {task_id!r} lacks {', '.join(missing) or 'string fields'} "
                                 f"(needs {', '.join(needed)}); use the release file {FILES[dataset]} as published")
    for task in tasks.values():
        task["atol"] = float(task["atol"] or 0)
        for split in ("base_input", "plus_input"):
            task[split] = list(task[split] or [])  # Mbpp/793 has ``{}`` for no plus inputs
    return tasks


def file_digest(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


# ---- expected outputs ----------------------------------------------------------------------------
@dataclass
class Oracle:
    """Expected outputs (wire form) and the canonical solution's seconds per call, per split, for
    the inputs kept: an input whose canonical output is too large to send through the sandbox's
    pipe (more than ``_wire.MAX_NODES`` parts; Mbpp/255's 1.7M 77-tuples) is left out, and
    ``dropped`` names it (``{"base": [...], "plus": [...]}``, indices into the task's inputs)."""

    base: list
    plus: list
    base_time: list[float]
    plus_time: list[float]
    dropped: dict = field(default_factory=lambda: {"base": [], "plus": []})

    def time_limits(self, split: str) -> list[float]:
        times = self.base_time if split == "base" else self.plus_time
        return [max(MIN_TIME_LIMIT, TIME_LIMIT_FACTOR * t) for t in times]

    def inputs(self, task: dict, split: str) -> list:
        """The task's inputs of ``split`` that have an expected output."""
        skip = set(self.dropped.get(split, []))
        return [x for i, x in enumerate(task[f"{split}_input"]) if i not in skip]

    @cached_property
    def message_cap(self) -> int:
        """The largest result message a right answer can need: 8 x the largest expected output's
        encoding (a float within tolerance may print longer than the expected one) + 1 MiB.
        Computed once per task, not once per completion."""
        largest = max((len(json.dumps(v, separators=(",", ":"))) for v in self.base + self.plus), default=0)
        return 8 * largest + (1 << 20)


def cache_dir(dataset: str, digest: str) -> Path:
    """One gzipped JSON file per task, under a folder named by the data file's digest."""
    root = Path(os.environ.get("RPT_CACHE_DIR") or Path.home() / ".cache" / "rpt") / "evalplus"
    return root / f"{dataset}-{digest}-v{CACHE_VERSION}"


def _not_none_tasks(dataset: str) -> set[str]:
    _, oracle = _evalplus()
    return set(oracle.MBPP_OUTPUT_NOT_NONE_TASKS) if dataset == "mbpp" else set()


def _task_file(folder: Path, task_id: str) -> Path:
    return folder / (task_id.replace("/", "_") + ".json.gz")


def _gzip_json(raw, entry: dict) -> None:
    """``entry`` as gzipped JSON into the binary file ``raw``."""
    with gzip.open(raw, "wt", encoding="utf-8", compresslevel=3) as handle:
        json.dump(entry, handle)


def expected_outputs(dataset: str, tasks: dict[str, dict], directory: str | Path | None = None,
                     workers: int | None = None, limits: Limits | None = None) -> dict[str, Oracle]:
    """Each task's canonical solution run once (in the sandbox, timed); the outputs are cached
    per task, so a later run (or one with a larger ``--limit``) only computes what is missing."""
    folder = cache_dir(dataset, file_digest(data_file(dataset, directory)))
    oracles: dict[str, Oracle] = {}
    for tid in tasks:
        path = _task_file(folder, tid)
        if path.is_file():
            try:
                with gzip.open(path, "rt", encoding="utf-8") as handle:
                    oracles[tid] = Oracle(**json.load(handle))
            except (OSError, ValueError, TypeError):
                pass  # a damaged entry is computed again
    todo = [(tid, t) for tid, t in tasks.items() if tid not in oracles]
    if not todo:
        return oracles
    not_none = _not_none_tasks(dataset)
    jobs = [Job(t["prompt"] + t["canonical_solution"], mode="calls", entry_point=t["entry_point"],
                inputs=[_wire.to_json(x) for x in t["base_input"] + t["plus_input"]], timing=True, total_limit=1200.0)
            for _, t in todo]
    print(f"computing the expected outputs of {len(jobs)} {dataset}+ tasks from their canonical solutions "
          f"(once; cached in {folder})", file=sys.stderr)
    folder.mkdir(parents=True, exist_ok=True)

    def done(j: int, execution: Execution) -> None:
        tid, task = todo[j]
        results = [m for m in execution.messages if "i" in m]
        if len(results) != len(jobs[j].inputs) or any("e" in m for m in results):
            errors = [m.get("e") for m in results if "e" in m][:1] or [exit_reason(execution)]
            print(f"error: {tid}: the canonical solution did not run on every input ({errors[0]})", file=sys.stderr)
            return
        n_base = len(task["base_input"])
        entry = {"base": [], "plus": [], "base_time": [], "plus_time": [], "dropped": {"base": [], "plus": []}}
        for i, m in enumerate(results):
            split, index = ("base", i) if i < n_base else ("plus", i - n_base)
            if "x" in m:  # too large to send: left out (see Oracle)
                entry["dropped"][split].append(index)
                continue
            value = m["v"]
            if task["entry_point"] in not_none:
                value = _wire.to_json(_wire.from_json(value) is not None)
            entry[split].append(value)
            entry[f"{split}_time"].append(float(m["t"]))
        path = _task_file(folder, tid)
        # atomic: a concurrent or interrupted run never sees half an entry
        write_atomic(path, lambda raw: _gzip_json(raw, entry))
        oracles[tid] = Oracle(**entry)

    limits = limits or Limits(timeout=60.0, memory_bytes=4 << 30)
    # The canonical solutions are trusted: their outputs may be as large as the whole result cap.
    limits = dataclasses.replace(limits, max_message_bytes=max(limits.max_message_bytes, limits.max_result_bytes))
    run_jobs(jobs, limits, workers, on_done=done)
    missing = [tid for tid in tasks if tid not in oracles]
    if missing:
        raise RuntimeError(f"no expected outputs for {', '.join(missing[:5])}: their canonical solutions failed")
    return {tid: oracles[tid] for tid in tasks}


# ---- the comparison ------------------------------------------------------------------------------
class Judge:
    """EvalPlus's per-output check (``evalplus.eval.unsafe_execute``) for one split, on decoded
    values. Keeps EvalPlus's quirk that a float expected value switches ``atol`` to 1e-6 for the
    rest of the split."""

    def __init__(self, dataset: str, entry_point: str, atol: float) -> None:
        self.dataset, self.entry_point, self.atol = dataset, entry_point, atol
        self.evaluation, self.oracle = _evalplus()

    def __call__(self, inp: list, out, exp) -> bool:
        try:
            return self._match(inp, out, exp)
        except Exception:  # whatever the program returned, a failed comparison is a wrong output
            return False

    def _match(self, inp: list, out, exp) -> bool:
        import numpy as np

        oracle, ep = self.oracle, self.entry_point
        exact = out == exp
        if self.dataset == "mbpp":
            if ep == "are_equivalent":  # Mbpp/164
                exact = True
            elif ep == "sum_div":  # Mbpp/295
                exact = exact or out == 0
            elif ep == "surface_Area":  # Mbpp/581
                exact = exact or abs(out - oracle._surface_Area(*inp)) <= self.atol
            elif ep == "digit_distance_nums":  # Mbpp/558
                exact = exact or out == oracle._digit_distance_nums(*inp)
            elif ep in oracle.MBPP_OUTPUT_SET_EQ_TASKS:
                _wire.check_hashes(out)  # set(out) of colliding values would stall this process
                exact = set(out) == set(exp)
            elif ep in oracle.MBPP_OUTPUT_NOT_NONE_TASKS:
                exact = out == exp if isinstance(out, bool) else exp == (out is not None)
        if self.dataset == "humaneval" and ep == "find_zero":
            return bool(abs(oracle._poly(*inp, out)) <= self.atol)
        if self.atol == 0 and self.evaluation.is_floats(exp):
            self.atol = 1e-6
        if not exact and self.atol != 0:
            if type(out) is not type(exp):
                return False
            if isinstance(exp, (list, tuple)) and len(out) != len(exp):
                return False
            return bool(np.allclose(out, exp, rtol=1e-07, atol=self.atol))
        return bool(exact)


def build_job(dataset: str, task: dict, oracle: Oracle, code: str) -> Job:
    """The program ``code`` (:func:`rpt.evaluation.samples_jsonl.program`) called on every base, then plus
    input, under EvalPlus's limits."""
    base_limits, plus_limits = oracle.time_limits("base"), oracle.time_limits("plus")
    inputs = oracle.inputs(task, "base") + oracle.inputs(task, "plus")
    if len(inputs) != len(base_limits) + len(plus_limits):
        raise ValueError(f"{task['task_id']}: {len(inputs)} inputs but {len(base_limits) + len(plus_limits)} expected "
                         "outputs: the cached expected outputs do not belong to this data")
    return Job(code, mode="calls", entry_point=task["entry_point"],
               inputs=[_wire.to_json(x) for x in inputs],
               time_limits=base_limits + plus_limits,
               total_limit=min(SPLIT_TIME_LIMIT, sum(base_limits)) + min(SPLIT_TIME_LIMIT, sum(plus_limits)),
               max_message_bytes=oracle.message_cap)


class Verdict:
    """Watches one job's messages as they arrive and decides base / plus; stops the run at the
    first wrong output (which settles both splits it reaches)."""

    def __init__(self, dataset: str, task: dict, oracle: Oracle) -> None:
        self.task, self.oracle = task, oracle
        self.n_base = len(oracle.base)
        self.inputs = oracle.inputs(task, "base") + oracle.inputs(task, "plus")
        self.expected = oracle.base + oracle.plus
        self.judges = {split: Judge(dataset, task["entry_point"], task["atol"]) for split in ("base", "plus")}
        self.passed = 0  # results checked and right, in order
        self.failure: str | None = None

    def __call__(self, message: dict) -> bool:
        """Reduce one message to the verdict so far (nothing of it is kept); False stops the run.
        Whatever the message holds, a failure is this program's, never an exception."""
        try:
            return self._check(message)
        except Exception as exc:  # noqa: BLE001 - a hostile value must fail its own item only
            self.failure = f"failed: result {self.passed}: unreadable output ({type(exc).__name__})"
            return False

    def _check(self, message: dict) -> bool:
        if "i" not in message:
            return True
        i = self.passed
        if message.get("i") != i or i >= len(self.inputs):
            self.failure = "failed: out-of-order result from the program"
            return False
        split = "base" if i < self.n_base else "plus"
        if "x" in message:
            self.failure = f"failed: {split} input {i}: output too large to check"
            return False
        if "e" in message:
            error = str(message["e"])[:300]
            self.failure = "timed out" if "time limit of this call" in error else f"failed: {split} input {i}: {error}"
            return False
        try:
            out = _wire.from_json(message.get("v"))
            exp = _wire.from_json(self.expected[i])
        except _wire.WireError as exc:
            self.failure = f"failed: {split} input {i}: unreadable output ({exc})"
            return False
        if not self.judges[split](self.inputs[i], out, exp):
            self.failure = f"failed: {split} input {i - (0 if split == 'base' else self.n_base)}: wrong output"
            return False
        self.passed += 1
        return True

    def outcome(self, execution: Execution) -> dict:
        """``base_passed``, ``plus_passed``, ``result`` (plus's reason), ``base_result``."""
        total = len(self.inputs)
        reason = self.failure
        if reason is None and self.passed < total:
            reason = "timed out" if execution.status == "timed out" else exit_reason(execution)
        base_ok = self.passed >= self.n_base
        plus_ok = self.passed == total
        left_out = sum(len(v) for v in self.oracle.dropped.values())
        return {"base_passed": base_ok, "plus_passed": plus_ok, "result": "passed" if plus_ok else reason,
                "base_result": "passed" if base_ok else reason, "n_inputs": total, "inputs_left_out": left_out}


def score(dataset: str, records: Sequence[dict], tasks: dict[str, dict], oracles: dict[str, Oracle],
          limits: Limits | None = None, workers: int | None = None,
          cached: Callable[[dict], dict | None] | None = None,
          on_done: Callable[[dict, dict], None] | None = None) -> list[dict]:
    """Score ``{task_id, completion[, solution]}`` records (the program: ``solution``, else
    ``prompt + completion``) in input order: ``task_id``, ``completion``, ``solution`` where given,
    ``base_passed``, ``plus_passed``, ``passed`` (= plus), ``result``, ``base_result``.
    ``cached`` / ``on_done`` as in :func:`rpt.evaluation.humaneval.score_completions`."""
    results: list[dict | None] = [cached(r) if cached else None for r in records]
    todo = [i for i, r in enumerate(results) if r is None]
    verdicts = [Verdict(dataset, tasks[records[i]["task_id"]], oracles[records[i]["task_id"]]) for i in todo]

    def finished(j: int, execution: Execution) -> None:
        record = records[todo[j]]
        outcome = verdicts[j].outcome(execution)
        result = {"task_id": record["task_id"], "completion": record["completion"], **samples.solution_of(record),
                  "passed": outcome["plus_passed"], **outcome}
        results[todo[j]] = result
        if on_done is not None:
            on_done(record, result)

    jobs = [build_job(dataset, tasks[records[i]["task_id"]], oracles[records[i]["task_id"]],
                      samples.program(tasks[records[i]["task_id"]]["prompt"], records[i])) for i in todo]
    run_jobs(jobs, limits=limits, workers=workers, on_done=finished, watch=lambda j: verdicts[j])
    return [r for r in results if r is not None]
