"""Model-free evaluation: sandboxed code execution, HumanEval/GSM8K scoring, the synthetic
NTP-vs-RPT experiment, the degenerate-repetition metric and result/report helpers."""
