import os

# Tests never touch the network and never need a wandb account.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads OpenMP
# A compile failure raises (rpt.decode_forward.compile_guard): no compile test passes by silently decoding eagerly;
# the fallback's own tests switch it off.
os.environ.setdefault("RPT_STRICT_COMPILE", "1")

import torch  # noqa: E402

# One intra-op thread: tiny-model tests are dominated by thread hand-offs, and two threads on a
# shared 2-core machine can slow a 0.4 s test to over a minute. Set once here for every module;
# nothing in rpt/ or the tests changes it.
torch.set_num_threads(1)



# Under pytest-xdist the multi-process tests (marked `multiprocess`, 20-50 s each) start first: the last test a worker
# takes decides when the run ends, and one of them taken last would leave the other core idle meanwhile.
def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.get_closest_marker("multiprocess") is None)  # stable: the rest keep their order
