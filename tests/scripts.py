"""The repository's scripts (``eval/*.py``, ``benchmarks/*.py``) are not a package: import them by path."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative_path: str):
    """A fresh module object for ``ROOT / relative_path`` (each call executes the file again)."""
    name = "script_" + relative_path.removesuffix(".py").replace("/", "_")
    spec = importlib.util.spec_from_file_location(name, ROOT / relative_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
