"""The decode's model call: :class:`~rpt.decode_forward.queries.ModelQueries` (logits of query tokens
against a position-addressed KV cache), the cache (``kv_cache``), what a query sees (``visibility``,
eq. 4's masks), the fused Llama call (``decode_model``, ``fused_weights``) and compile failures told
apart from the decode's own errors (``compile_guard``).

It holds the one primitive the RPT decoder, the error analysis and the decode benchmarks share, and
imports no training and no sampling. This ``__init__`` imports nothing.
"""
