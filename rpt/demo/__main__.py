"""``python -m rpt.demo``: the demo's command line (:mod:`rpt.demo.cli`)."""

import sys

from rpt.demo.cli import main

sys.exit(main())
