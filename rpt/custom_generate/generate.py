"""RPT (Resample-Previous-Tokens) sampling for transformers' ``custom_generate``.

    model = AutoModelForCausalLM.from_pretrained(ckpt)
    out = model.generate(input_ids, custom_generate=ckpt, trust_remote_code=True,
                         rpt_iters=1, rpt_window=2, max_new_tokens=64, seed=0)

Any ``rpt.sampling.SamplingConfig`` field is a keyword, and ``compile=True`` compiles the decode
(CUDA graphs on a GPU; off by default); see ``rpt/hf_generate.py``. Needs the
``rpt`` package installed (``pip install -e .`` in the project's repository).
"""

from rpt.hf_generate import generate  # noqa: F401  (transformers looks up `generate` in this module)
