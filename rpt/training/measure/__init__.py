"""A training step measured: metrics.jsonl (tokens/s, MFU, peak memory), loss-curve plots, the FLOPs of
every matrix product by operand dtype, and a step's kernels and time by part."""
