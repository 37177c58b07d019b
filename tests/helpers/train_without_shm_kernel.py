"""``train.py`` with DeepSpeed's shared-memory all-reduce kernel left unbuilt, for one-process DeepSpeed
tests on the CPU.

DeepSpeed builds that kernel (``deepspeed_shm_comm``: g++ on two files that include torch's headers, about
80 CPU-seconds) the first time any process starts its communication backend, then keeps it in
``TORCH_EXTENSIONS_DIR``; a fresh CI machine pays it in the test that happens to be first. It reduces across
the ranks of one machine, and a one-process run has none, so the run is the same without it:
``build_shm_op`` returning None is DeepSpeed's own path where the kernel cannot be built (every platform but
Linux). ``make test-slow``'s DeepSpeed launches run plain ``train.py`` and build it.
"""

import importlib
import os
import runpy
import sys

# import_module, not `deepspeed.comm.torch`: that attribute path names the torch package deepspeed.comm imports
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # read at call time by TorchBackend

TRAIN_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "train.py")

if __name__ == "__main__":
    sys.argv[0] = TRAIN_PY
    runpy.run_path(TRAIN_PY, run_name="__main__")
