"""The run directory's own files, checked at start-up before a run reads or appends to them.

Each file a run writes into ``output_dir`` must be a file (or absent): a directory in its place
would fail the run at its first log line, or at the end, after all the training. The logs a
resume appends to (``metrics.jsonl``, ``train.log``, ``segments.jsonl``) are read through
:mod:`rpt.append_log`: a torn last line is dropped with a note, any other damage is one error
naming the file and the line, before anything is built. Costs one read of each log (a few ms).
"""

from __future__ import annotations

import os

from rpt.checkpoint.directories import CHECKPOINT_RE
from rpt.training.config import ConfigError
from rpt.training.measure.metrics import read_metrics_log
from rpt.training.run_dir.log import read_train_log
from rpt.training.run_dir.record import CONFIG_RECORD, read_config_record, read_segments_log

# Written by a run as plain files (rpt.training, rpt.training.run_dir.log, rpt.training.run_dir.record, rpt.training.measure.plotting).
RECORD_FILES = (CONFIG_RECORD, "segments.jsonl", "metrics.jsonl", "train.log", "run_summary.txt",
                "eval_batches.json", "replicas.json", "loss_curves.png")


def check_run_files(output_dir: str) -> list[str]:
    """Every record file of ``output_dir`` usable; returns the notes to print (torn last lines)."""
    for name in RECORD_FILES:
        path = os.path.join(output_dir, name)
        if os.path.isdir(path):
            raise ConfigError(f"{path} is a directory, but the run writes its {name} there; move the directory away "
                              "or use another output_dir")
    names = os.listdir(output_dir) if os.path.isdir(output_dir) else []
    for name in ["final"] + [n for n in names if CHECKPOINT_RE.match(n)]:
        path = os.path.join(output_dir, name)
        if os.path.lexists(path) and not os.path.isdir(path):  # the rename that commits it would fail after training
            raise ConfigError(f"{path} is not a directory, but the run writes a checkpoint there; move it away or use "
                              "another output_dir")
    read_config_record(output_dir)
    logs = [read_metrics_log(os.path.join(output_dir, "metrics.jsonl")), read_train_log(os.path.join(output_dir, "train.log")),
            read_segments_log(output_dir)]
    return [log.note() for log in logs if log.note()]
