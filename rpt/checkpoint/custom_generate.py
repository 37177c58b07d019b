"""The ``custom_generate/`` files every RPT checkpoint carries, and their writer.

transformers runs a checkpoint's ``custom_generate/generate.py`` for ``model.generate(custom_generate=ckpt,
...)``; the file is two lines around ``from rpt.hf_generate import generate`` (:mod:`rpt.hf_generate`, a
frozen path: every checkpoint ever saved names it). Its text is kept here as data, not as a module of
the package, so the checkpoint format, which :meth:`~rpt.model.RPTForCausalLM.save_pretrained` writes,
does not import the sampler it names (the layer order of docs/design.md). ``tests/checkpoint/test_old_checkpoint.py``
holds both files byte for byte to those of a checkpoint saved before.
"""

import os

# The file transformers runs: it names rpt.hf_generate, which saved checkpoints import forever.
GENERATE_PY = '''"""RPT (Resample-Previous-Tokens) sampling for transformers' ``custom_generate``.

    model = AutoModelForCausalLM.from_pretrained(ckpt)
    out = model.generate(input_ids, custom_generate=ckpt, trust_remote_code=True,
                         rpt_iters=1, rpt_window=2, max_new_tokens=64, seed=0)

Any ``rpt.sampling.SamplingConfig`` field is a keyword, and ``compile=True`` compiles the decode
(CUDA graphs on a GPU; off by default); see ``rpt/hf_generate.py``. Needs the
``rpt`` package installed (``pip install -e .`` in the project's repository).
"""

from rpt.hf_generate import generate  # noqa: F401  (transformers looks up `generate` in this module)
'''

# requirements.txt beside it: what the file above needs installed (the custom_generate convention).
REQUIREMENTS_TXT = '''# the rpt package: `pip install -e .` in the project's repository (not on PyPI)
rpt>=0.1.0
transformers>=5.0
torch>=2.4
'''

FILES = {"generate.py": GENERATE_PY, "requirements.txt": REQUIREMENTS_TXT}


def write_custom_generate(checkpoint: str) -> None:
    """Write ``custom_generate/{generate.py,requirements.txt}`` into a checkpoint directory."""
    target = os.path.join(checkpoint, "custom_generate")
    os.makedirs(target, exist_ok=True)
    for name, text in FILES.items():
        with open(os.path.join(target, name), "w", encoding="utf-8", newline="") as f:
            f.write(text)
