"""What the start-up checks of a training run cost (none runs during a training step).

    python benchmarks/startup_checks.py [--rows 100000 --shards 1000 --files 10000]

Builds, in a temporary directory: a run directory whose metrics.jsonl and train.log hold
``--rows`` logged steps (a long run logged every step) and whose segments.jsonl holds 100
resumes; a token store of ``--shards`` shard files; a corpus of ``--files`` text files. Times
(best of ``--repeats``):

* ``check_run_files`` -- every record file read and parsed (rpt/training/run_dir/file_checks.py);
* ``take_run_lock`` + ``release_run_lock`` -- the output directory's lock (rpt/training/run_dir/lock.py);
* ``TokenStore(path)`` -- index.json checked, one ``stat`` per shard (rpt/data/token_store.py);
* ``content_fingerprint`` -- one ``stat`` per corpus file, the key of a cached store;
* ``TokenStore.check_unchanged`` -- a resume's check of the shards against its checkpoint's stamps:
  nothing changed (one ``stat`` per shard), and one shard rewritten (that shard hashed);
* ``TokenStore.verify`` -- the full read on request (``prepare_data.py --verify``), in MB/s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rpt.data.sources import content_fingerprint  # noqa: E402
from rpt.data.token_store import FORMAT, INDEX, VERSION, TokenStore  # noqa: E402
from rpt.training.run_dir.file_checks import check_run_files  # noqa: E402
from rpt.training.run_dir.lock import release_run_lock, take_run_lock  # noqa: E402
from rpt.training.run_dir.log import step_line  # noqa: E402


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def run_dir(root: str, rows: int) -> str:
    run = os.path.join(root, "run")
    os.makedirs(run)
    with open(os.path.join(run, "metrics.jsonl"), "w") as m, open(os.path.join(run, "train.log"), "w") as log:
        for step in range(1, rows + 1):
            row = {"step": step, "loss": 3.0, "ntp_loss": 3.1, "ptp_loss_1": 3.2, "ptp_loss_2": 3.3, "lr": 3e-4,
                   "grad_norm": 1.0, "tokens_per_s": 1e5, "mfu": 0.3, "peak_mem_mb": 1000.0, "data_position": 8 * step}
            m.write(json.dumps(row) + "\n")
            log.write(step_line(row, rows) + "\n")
    with open(os.path.join(run, "segments.jsonl"), "w") as f:
        for i in range(100):
            f.write(json.dumps({"segment": i, "from_step": i * rows // 100, "max_steps": rows, "changed": {}}) + "\n")
    return run


def store(root: str, shards: int, tokens: int) -> str:
    path = os.path.join(root, "store")
    os.makedirs(path)
    entries = []
    for i in range(shards):
        name = f"tokens-{i:05d}.bin"
        np.arange(tokens, dtype=np.uint16).tofile(os.path.join(path, name))
        entries.append({"file": name, "tokens": tokens})
    index = {"format": FORMAT, "version": VERSION, "dtype": "uint16", "num_tokens": shards * tokens,
             "shards": entries, "vocab_size": 65536}
    import hashlib

    digest = hashlib.sha256(np.arange(tokens, dtype=np.uint16).tobytes()).hexdigest()
    for e in entries:
        e["sha256"] = digest
    with open(os.path.join(path, INDEX), "w") as f:
        json.dump(index, f)
    return path


def corpus(root: str, files: int) -> dict:
    directory = os.path.join(root, "corpus")
    os.makedirs(directory)
    for i in range(files):
        with open(os.path.join(directory, f"doc{i:06d}.txt"), "w") as f:
            f.write("def f(x):\n    return x\n")
    return {"path": os.path.join(directory, "*.txt")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--shards", type=int, default=1000)
    ap.add_argument("--shard-tokens", type=int, default=65536)
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as root:
        run = run_dir(root, args.rows)
        path = store(root, args.shards, args.shard_tokens)
        source = corpus(root, args.files)
        opened = TokenStore(path)
        mb = opened.num_tokens * 2 / 1e6
        results = [
            (f"check_run_files: {args.rows:,} metrics rows + train.log lines, 100 segments",
             best(lambda: check_run_files(run), args.repeats)),
            ("take_run_lock + release_run_lock", best(lambda: (take_run_lock(run), release_run_lock(run)), args.repeats)),
            (f"TokenStore(): index + {args.shards:,} shards stat-ed", best(lambda: TokenStore(path), args.repeats)),
            (f"content_fingerprint: {args.files:,} corpus files", best(lambda: content_fingerprint(source), args.repeats)),
        ]
        stamps = opened.stamps()
        stamps["at_ns"] += 20 * 10**9  # recorded 20 s after the store was written: no stamp is racy
        results.append((f"check_unchanged (resume): {args.shards:,} shards, none changed",
                        best(lambda: opened.check_unchanged(stamps, "the checkpoint"), args.repeats)))
        os.utime(opened.files[0])  # a new ctime: that shard is hashed (its bytes are the same)
        results.append((f"check_unchanged (resume): 1 of {args.shards:,} shards touched, "
                        f"{args.shard_tokens * 2 / 1e6:.2f} MB hashed",
                        best(lambda: opened.check_unchanged(stamps, "the checkpoint"), args.repeats)))
        for what, seconds in results:
            print(f"{what:<70} {seconds * 1000:9.1f} ms")
        seconds = best(opened.verify, 1)
        print(f"{f'TokenStore.verify (on request): {mb:,.0f} MB':<70} {seconds * 1000:9.1f} ms  ({mb / seconds:,.0f} MB/s)")


if __name__ == "__main__":
    main()
