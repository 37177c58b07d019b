"""``make demo``: the papers' protocol in miniature, on a CPU, with a model trained here
(``python -m rpt.demo``; the stages and options are in :mod:`rpt.demo.protocol`).

The modules: :mod:`~rpt.demo.protocol` (the options and the schedule of the stages),
:mod:`~rpt.demo.stages` (stages run once, cached, in the background or side by side),
:mod:`~rpt.demo.processes` (a stage's command, in front or in the background),
:mod:`~rpt.demo.training_stages` (the corpus, AR-C, AR-F and the RPT fine-tunes),
:mod:`~rpt.demo.evaluation_stages` (the error analysis, repetition, HumanEval, the theory test),
:mod:`~rpt.demo.report_json` (``report.json`` from the stage results) and
:mod:`~rpt.demo.report_markdown` (``report.md``).
"""

from rpt.demo.protocol import main
from rpt.demo.report_json import build_report
from rpt.demo.stages import Stages
from rpt.demo.training_stages import fine_tune_commands, fine_tune_name

__all__ = ["Stages", "build_report", "fine_tune_commands", "fine_tune_name", "main"]
