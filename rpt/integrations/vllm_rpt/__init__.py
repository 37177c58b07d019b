"""RPT inside vLLM's V1 engine: the tail, newest token and PTP chains of each request are a step's
draft tokens, and the project's unchanged ``decode_row`` program decides what is emitted.

The engine-independent pieces (no vLLM import): :mod:`.codes` (the row layout and its id codes),
:mod:`.settings` (a request's settings from ``extra_args``), :mod:`.driver` (one request's decode
driven by a step's logits). The vLLM pieces import vLLM: :mod:`.internals` (the checked version
range and every internal the integration overrides), :mod:`.plugin` (registration), :mod:`.model`
and :mod:`.side_attention` (offsets, true positions and the chains' visibility), :mod:`.runner`,
:mod:`.worker`, :mod:`.scheduler`, :mod:`.drafts` and :mod:`.launch` (``rpt_engine_args``).
docs/serving.md shows ``LLM(**rpt_engine_args(ckpt))`` and ``vllm serve``.
"""
