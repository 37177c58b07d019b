"""The ``custom_generate/`` files every RPT checkpoint carries, and their writer.

``generate.py`` here is the file transformers runs for ``model.generate(custom_generate=ckpt, ...)``
(it calls :func:`rpt.hf_generate.generate`); :func:`write_custom_generate` copies it and
``requirements.txt`` into a checkpoint. This package's ``__init__`` imports nothing of ``rpt``, so
:mod:`rpt.model` can call the writer without importing the sampler.
"""

import os
import shutil

TEMPLATE_DIR = os.path.dirname(os.path.abspath(__file__))
TEMPLATE_FILES = ("generate.py", "requirements.txt")


def write_custom_generate(checkpoint: str) -> None:
    """Copy ``custom_generate/{generate.py,requirements.txt}`` into a checkpoint directory."""
    target = os.path.join(checkpoint, "custom_generate")
    os.makedirs(target, exist_ok=True)
    for name in TEMPLATE_FILES:
        shutil.copyfile(os.path.join(TEMPLATE_DIR, name), os.path.join(target, name))
