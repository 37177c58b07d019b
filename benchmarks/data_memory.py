"""Memory and speed of the data path against corpus size: prepare_data.py and train.py.

    python benchmarks/data_memory.py [--tokens 1200000 --scale 10 --num-proc 1 2]

Builds a local JSONL corpus of about ``--tokens`` tokens (stdlib source files) and one
``--scale`` times larger (``--scale`` copies of it, each document marked with its copy number so
no two are equal: the same documents, only more of them), with a fixed BPE tokenizer (4096
tokens, trained once). For each corpus it runs, as fresh processes:

* ``prepare_data.py --num-proc N`` for each N: the main process's peak resident memory
  (``wait4``'s ``ru_maxrss``) and the tokens/s the writer reports;
* ``train.py`` (3 steps of a micro Llama, one process) on the raw corpus, so the token store is
  prepared on the fly inside the training process: its peak resident memory.

Prints the growth from the small corpus to the large one (the issue's bounds: training
<= 64 MB, prepare_data.py <= 256 MB), then prepare_data.py's tokens/s on the large corpus for
each process count, alternating runs (``--repeats``) so machine load affects them alike.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rpt.studies import owned_dirs  # noqa: E402

OWNER = "data-memory benchmark"  # names the writer of the cache directories it deletes between runs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env() -> dict:
    return dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline", TOKENIZERS_PARALLELISM="false", PYTHONPATH=ROOT)


def peak_rss_mb(cmd: list[str]) -> tuple[float, str]:
    """Run ``cmd``; its own peak resident memory (MB) and its stdout."""
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, env=_env(), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{text[-3000:]}")
    return usage.ru_maxrss / 1024, text


def make_tokenizer(workdir: str) -> str:
    from rpt.data import stdlib_texts, train_bpe_tokenizer

    path = os.path.join(workdir, "tokenizer")
    train_bpe_tokenizer(stdlib_texts(None, 0.0, max_files=300), 4096).save_pretrained(path)
    return path


def make_corpus(path: str, tokens: int, tokenizer, copies: int = 1) -> int:
    """A JSONL corpus: ``copies`` copies (each document marked with its copy number, so none
    repeats) of a set of stdlib files holding about ``tokens`` tokens; returns the count."""
    from rpt.data import stdlib_texts

    texts, total = [], 0
    for t in stdlib_texts(None, 0.0):
        if total >= tokens:
            break
        texts.append(t)
        total += len(tokenizer(t, add_special_tokens=False)["input_ids"]) + 1
    with open(path, "w") as f:
        for copy in range(copies):
            for t in texts:
                f.write(json.dumps({"text": f"# copy {copy}\n{t}"}) + "\n")
    return total * copies


def config(workdir: str, corpus: str, tokenizer: str, name: str) -> str:
    path = os.path.join(workdir, f"{name}.yaml")
    cfg = {
        "model": {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128},
        "tokenizer": tokenizer, "data": {"path": corpus}, "val_fraction": 0.01, "seq_len": 64,
        "micro_batch_size": 4, "max_steps": 3, "eval_every": 3, "eval_batches": 1, "log_every": 1, "save_every": 3,
        "plot": False, "cache_dir": os.path.join(workdir, f"cache-{name}"), "output_dir": os.path.join(workdir, f"run-{name}"),
    }
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return path


def measure(workdir: str, tokens: int, scale: int, num_procs: list[int]) -> dict:
    from transformers import AutoTokenizer

    tok_path = make_tokenizer(workdir)
    tok = AutoTokenizer.from_pretrained(tok_path)
    results: dict = {}
    for name, copies in (("small", 1), ("large", scale)):
        corpus = os.path.join(workdir, f"{name}.jsonl")
        approx = make_corpus(corpus, tokens, tok, copies)
        cfg = config(workdir, corpus, tok_path, name)
        row: dict = {"approx_tokens": approx, "corpus_mb": os.path.getsize(corpus) / 2**20}
        for n in num_procs:
            owned_dirs.fresh(os.path.join(workdir, f"cache-{name}"), OWNER)  # only a cache this script made
            rss, out = peak_rss_mb([sys.executable, "prepare_data.py", "--config", cfg, "--num-proc", str(n), "--split", "train"])
            store = next(line for line in out.splitlines() if line.startswith("train:"))
            tps = float(store.split(" at ")[1].split(" tokens/s")[0].replace(",", ""))
            row[f"prepare_{n}"] = {"peak_mb": rss, "tokens_per_s": tps}
            row["tokens"] = int(store.split("train: ")[1].split(" tokens")[0].replace(",", ""))
        owned_dirs.fresh(os.path.join(workdir, f"cache-{name}"), OWNER)
        rss, _ = peak_rss_mb([sys.executable, "train.py", "--config", cfg])
        row["train_peak_mb"] = rss
        results[name] = row
    return results


def throughput(workdir: str, num_procs: list[int], repeats: int) -> dict[int, list[float]]:
    """prepare_data.py tokens/s on the large corpus, the process counts alternating."""
    cfg = os.path.join(workdir, "large.yaml")
    rates: dict[int, list[float]] = {n: [] for n in num_procs}
    for r in range(repeats):
        for n in num_procs if r % 2 == 0 else list(reversed(num_procs)):
            owned_dirs.fresh(os.path.join(workdir, "cache-large"), OWNER)
            _, out = peak_rss_mb([sys.executable, "prepare_data.py", "--config", cfg, "--num-proc", str(n), "--split", "train"])
            line = next(line for line in out.splitlines() if line.startswith("train:"))
            rates[n].append(float(line.split(" at ")[1].split(" tokens/s")[0].replace(",", "")))
    return rates


def report(results: dict, num_procs: list[int]) -> str:
    small, large = results["small"], results["large"]
    lines = [f"corpus: {small['tokens']:,} -> {large['tokens']:,} tokens ({small['corpus_mb']:.0f} -> {large['corpus_mb']:.0f} MB of JSONL)"]
    for n in num_procs:
        a, b = small[f"prepare_{n}"], large[f"prepare_{n}"]
        lines.append(f"prepare_data.py --num-proc {n}: peak (any of its processes) {a['peak_mb']:.0f} -> {b['peak_mb']:.0f} MB "
                     f"(+{b['peak_mb'] - a['peak_mb']:.0f} MB); {a['tokens_per_s']:,.0f} / {b['tokens_per_s']:,.0f} tokens/s")
    lines.append(f"train.py (store prepared on the fly, 3 steps): peak {small['train_peak_mb']:.0f} -> {large['train_peak_mb']:.0f} MB "
                 f"(+{large['train_peak_mb'] - small['train_peak_mb']:.0f} MB)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=1_200_000)
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--num-proc", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3, help="alternating prepare_data.py runs per process count")
    ap.add_argument("--workdir", default=None, help="default: a temporary directory, removed afterwards")
    args = ap.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="rpt-data-memory-")
    problem = next(filter(None, (owned_dirs.problem(os.path.join(workdir, f"cache-{n}"), OWNER, "delete")
                                 for n in ("small", "large"))), None)
    if problem:  # before any corpus is written
        sys.exit(f"error: {problem}")
    try:
        print(report(measure(workdir, args.tokens, args.scale, args.num_proc), args.num_proc))
        if args.repeats:
            import statistics

            rates = throughput(workdir, args.num_proc, args.repeats)
            print("prepare_data.py on the large corpus, median of", args.repeats, "alternating runs: " + ", ".join(
                f"{n} process(es) {statistics.median(r):,.0f} tokens/s" for n, r in rates.items()))
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
