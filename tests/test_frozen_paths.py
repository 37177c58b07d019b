"""The frozen paths of docs/design.md ("Frozen paths") keep importing whatever the layout: paths that
saved checkpoints, users' configurations and other programs name. Each is imported (vLLM's only where
vLLM is installed: elsewhere its class is found in the source), and the list here is the list there."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re

import pytest

from tests.helpers.scripts import ROOT

FROZEN = [
    "rpt.hf_generate:generate",
    "rpt.integrations.vllm:LZPenalty",
    "rpt.integrations.vllm_rpt.plugin:register",
    "rpt.integrations.vllm_rpt.launch:rpt_engine_args",
    "rpt.integrations.vllm_rpt.worker:RPTCPUWorker",
    "rpt.integrations.vllm_rpt.scheduler:RPTScheduler",
    "rpt.integrations.vllm_rpt.drafts:Drafts",
    "rpt.evaluation.lm_eval_adapter:RPTLM",
    "rpt.sampling:generate",
    "rpt.sampling:SamplingConfig",
    "rpt.model:RPTForCausalLM",
    "rpt.demo",
]
NEEDS = {"rpt.integrations.vllm": "vllm", "rpt.integrations.vllm_rpt.worker": "vllm",
         "rpt.integrations.vllm_rpt.scheduler": "vllm"}  # module -> the optional dependency its import needs


def design_frozen_paths() -> list[str]:
    section = (ROOT / "docs" / "design.md").read_text().split("## Frozen paths", 1)[1].split("\n## ", 1)[0]
    heads = [line.split(" -- ", 1)[0] for line in section.splitlines() if line.startswith("* ")]
    return [p for head in heads for p in re.findall(r"`(rpt[\w.]*(?::\w+)?)`", head)]


def test_design_states_the_frozen_paths_this_test_imports():
    assert sorted(design_frozen_paths()) == sorted(FROZEN)


@pytest.mark.parametrize("path", FROZEN)
def test_frozen_path_imports(path):
    module, _, name = path.partition(":")
    needs = NEEDS.get(module)
    if needs and importlib.util.find_spec(needs) is None:  # the class is there; its import needs vLLM
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin
        tree = ast.parse(open(spec.origin).read())
        assert name in {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
        return
    loaded = importlib.import_module(module)
    if name:
        assert getattr(loaded, name) is not None


def test_every_entry_point_names_a_frozen_path():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    targets = [target for group in project["entry-points"].values() for target in group.values()]
    assert targets and sorted(set(targets) - set(FROZEN)) == []


def test_checkpoints_still_name_the_frozen_door():
    """What every checkpoint's custom_generate/generate.py imports is the frozen rpt.hf_generate."""
    from rpt.checkpoint.custom_generate import GENERATE_PY

    imports = [n for n in ast.walk(ast.parse(GENERATE_PY)) if isinstance(n, ast.ImportFrom)]
    assert [(n.module, [a.name for a in n.names]) for n in imports] == [("rpt.hf_generate", ["generate"])]
    assert "rpt.hf_generate:generate" in FROZEN
