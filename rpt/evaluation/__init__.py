"""The benchmarks: HumanEval, EvalPlus (HumanEval+/MBPP+), GSM8K and Table 1 scored from a
checkpoint's samples; the one script skeleton, the sampling sweeps, the lm-evaluation-harness
model, and the model-side helpers they share (loading, batched generation, model arguments)."""
