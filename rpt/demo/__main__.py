"""``python -m rpt.demo``: the demo's command line (:mod:`rpt.demo.protocol`)."""

import sys

from rpt.demo.protocol import main

sys.exit(main())
