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


# Under pytest-xdist these multi-process tests (20-50 s each) start first: the last test a worker takes decides when
# the run ends, and one of them taken last would leave the other core idle meanwhile. No module fixture is shared
# with them, so moving them costs no set-up twice.
RUN_FIRST = {
    "test_compiled_blocks_train_like_eager_and_compile_once",
    "test_zero3_streaming_recipe",
    "test_two_process_ddp_matches_single_process",
    "test_killed_run_resumes_exactly",
}


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.originalname not in RUN_FIRST)  # a stable sort: the rest keep their order
