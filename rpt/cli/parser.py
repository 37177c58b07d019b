"""The one-line answer to bad input: ``error: <the problem and the fix>`` on stderr and exit status 2,
whether argparse or the library finds the problem."""

from __future__ import annotations

import argparse
import os
import sys
import traceback


def report_input_error(exc: Exception, traceback_hint: bool = True) -> int:
    """The scripts' answer to bad input (an :class:`rpt.errors.InputError`, or a library's ``ValueError`` or
    ``OSError``): one line on stderr (the traceback only with ``RPT_TRACEBACK=1``); returns the exit code, 2.

    ``traceback_hint=False`` leaves out the pointer to ``RPT_TRACEBACK``, for the checks made before any
    work, whose message is the whole story."""
    if os.environ.get("RPT_TRACEBACK"):
        traceback.print_exc()
    message = " ".join(str(exc).split())  # a library's multi-line message (transformers' are) as one line
    hint = " (set RPT_TRACEBACK=1 for the traceback)" if traceback_hint else ""
    print(f"error: {message}{hint}", file=sys.stderr)
    return 2


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse whose errors (an unknown flag, a value of the wrong type) are one ``error: ...``
    line and exit status 2, as every other bad input of the scripts."""

    def error(self, message: str):
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)
