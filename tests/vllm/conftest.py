"""tests/vllm/ needs vLLM: `make test-vllm` runs it in .venv-vllm; elsewhere nothing here is collected
(and the `vllm` marker is deselected by default)."""

import importlib.util
import os

for name, value in {  # before vLLM is imported: one in-process engine on a small CPU
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "1",
}.items():
    os.environ.setdefault(name, value)

collect_ignore_glob = [] if importlib.util.find_spec("vllm") else ["test_*.py"]
