"""The package's shape: no import cycle in ``rpt/``, imports that follow the layer order
``docs/design.md`` states, and the checks themselves tried on hand-made graphs and packages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.import_graph import find_cycle, import_graph, module_files
from tests.helpers.scripts import ROOT

DESIGN = ROOT / "docs" / "design.md"
LAYER_ITEM = re.compile(r"^(\d+)\. \*\*([^*]+)\*\* -- (.*)$")


def stated_layers() -> list[tuple[str, list[str]]]:
    """``[(layer name, [module patterns])]`` in order, from design.md's "## Layers" list."""
    section = DESIGN.read_text().split("## Layers", 1)[1].split("\n## ", 1)[0]
    layers = []
    for line in section.splitlines():
        match = LAYER_ITEM.match(line)
        if match:
            modules_part = match.group(3).split(":", 1)[0]
            layers.append((match.group(2), re.findall(r"`(rpt[\w.]*\*?)`", modules_part)))
    return layers


def layer_of(module: str, layers: list[tuple[str, list[str]]]) -> int | None:
    """The index of the layer whose most specific pattern names ``module`` (None: no layer does)."""
    best, best_len = None, -1
    for index, (_, patterns) in enumerate(layers):
        for pattern in patterns:
            prefix = pattern[:-2] if pattern.endswith(".*") else None
            hit = module == pattern or (prefix is not None and (module == prefix or module.startswith(prefix + ".")))
            if hit and len(pattern) > best_len:
                best, best_len = index, len(pattern)
    return best


def layer_violations(graph: dict[str, set[str]], layers) -> list[str]:
    return sorted(f"{a} ({layers[layer_of(a, layers)][0]}) imports {b} ({layers[layer_of(b, layers)][0]})"
                  for a, targets in graph.items() for b in targets
                  if layer_of(b, layers) > layer_of(a, layers))


@pytest.fixture(scope="module")
def graph():
    return import_graph(ROOT, "rpt")


def test_rpt_has_no_import_cycle(graph):
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_module_has_a_layer(graph):
    layers = stated_layers()
    assert len(layers) >= 5
    assert [m for m in graph if layer_of(m, layers) is None] == []


def test_imports_follow_the_stated_layers(graph):
    assert layer_violations(graph, stated_layers()) == []


def test_find_cycle_on_hand_made_graphs():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None  # a diamond is no cycle
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"y"}, "y": {"y"}}) == ["y", "y"]


def test_import_graph_sees_late_relative_and_package_imports(tmp_path):
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from p.sub.leaf import X\n")
    (pkg / "sub" / "leaf.py").write_text("X = 1\n")
    (pkg / "top.py").write_text("import os\n\ndef f():\n    from p.sub import leaf  # late\n    return leaf\n")
    (pkg / "rel.py").write_text("from .top import f\nfrom . import sub\n")
    assert set(module_files(tmp_path, "p")) == {"p", "p.sub", "p.sub.leaf", "p.top", "p.rel"}
    g = import_graph(tmp_path, "p")
    assert g["p.top"] == {"p.sub", "p.sub.leaf"}  # the late import, and the package __init__ it runs
    assert g["p.rel"] == {"p.top", "p.sub"}
    assert g["p.sub"] == {"p.sub.leaf"}  # its own package is not an edge
    assert g["p.sub.leaf"] == set()
    (pkg / "sub" / "leaf.py").write_text("def g():\n    import p.top\n")
    assert find_cycle(import_graph(tmp_path, "p")) == ["p.sub", "p.sub.leaf", "p.top", "p.sub"]


def test_layer_check_catches_an_upward_import():
    layers = [("low", ["q.a", "q.util.*"]), ("high", ["q.b"])]
    assert layer_of("q.util.deep", layers) == 0 and layer_of("q.c", layers) is None
    assert layer_violations({"q.a": set(), "q.b": {"q.a"}}, layers) == []
    assert layer_violations({"q.a": {"q.b"}, "q.b": set()}, layers) == ["q.a (low) imports q.b (high)"]


def file_map_names(text: str) -> set[str]:
    """The module files design.md's "Which module owns what" map names: an entry ``rpt/x.py``, or
    a package entry ``rpt/p/`` (its ``__init__.py``) and the ``name.py`` files its lines list."""
    section = text.split("## Which module owns what", 1)[1].split("```", 2)[1]
    named, head = set(), None
    for line in section.splitlines():
        if line.startswith("rpt/"):
            head = line.split()[0]
            named.add(head if head.endswith(".py") else head + "__init__.py")
        elif not line.startswith(" "):
            head = None
        if head is not None and head.endswith("/"):
            named.update(head + name for name in re.findall(r"\b(\w+\.py)\b", line))
    return named


def test_design_names_every_module():
    named = file_map_names(DESIGN.read_text())
    files = {str(path.relative_to(ROOT)) for path in module_files(ROOT, "rpt").values()}
    assert sorted(files - named) == []
    assert sorted(n for n in named if not (ROOT / n).is_file()) == []  # and names no module that is gone


def test_file_map_reader_on_a_hand_made_map():
    text = ("## Which module owns what\n\n```\nrpt/a.py   one\nrpt/p/     x.py (the x) and\n"
            "           y.py\nstudies\nrpt/q/     z.py\n```\n")
    assert file_map_names(text) == {"rpt/a.py", "rpt/p/__init__.py", "rpt/p/x.py", "rpt/p/y.py",
                                    "rpt/q/__init__.py", "rpt/q/z.py"}


def test_eval_scripts_stay_thin():
    """eval/*.py parse arguments and call the library: at most about 120 lines each."""
    long = {p.name: n for p in sorted((ROOT / "eval").glob("*.py")) if (n := len(p.read_text().splitlines())) > 120}
    assert long == {}


def late_rpt_imports(path) -> list[tuple[int, str]]:
    """``(line, text)`` of each ``rpt`` import inside a function of ``path`` (a late import)."""
    import ast

    source = path.read_text()
    lines = source.splitlines()
    found = []
    for func in ast.walk(ast.parse(source)):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(func):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                if any(n == "rpt" or n.startswith("rpt.") for n in names):
                    found.append((node.lineno, "\n".join(lines[node.lineno - 1:node.end_lineno])))
    return sorted(set(found))


def test_every_late_import_says_why():
    """A late import of rpt inside a function exists only to keep a heavy dependency out of an
    import, and says so on its line (``# late: ...``)."""
    silent = [f"{path.relative_to(ROOT)}:{line}" for path in module_files(ROOT, "rpt").values()
              for line, text in late_rpt_imports(path) if "# late:" not in text]
    assert silent == []


def test_late_import_finder_on_a_hand_made_file(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import rpt.model\n\ndef f():\n    from rpt.data import x  # late: torch\n    import json\n"
                 "\n\ndef g():\n    def h():\n        import rpt.model.lora\n    return h\n")
    assert late_rpt_imports(f) == [(4, "    from rpt.data import x  # late: torch"), (10, "        import rpt.model.lora")]


def test_the_top_of_rpt_holds_packages_and_at_most_six_modules():
    """Besides ``__init__`` and the applications (the last layer), the top of ``rpt/`` holds only the
    modules several layers share and the frozen doors (design.md, "Packages by job, and why")."""
    layers = stated_layers()
    top = [f"rpt.{p.stem}" for p in sorted((ROOT / "rpt").glob("*.py")) if p.name != "__init__.py"]
    shared = [m for m in top if layer_of(m, layers) != len(layers) - 1]
    assert len(shared) <= 6, shared


def test_no_package_init_over_80_lines_and_no_module_over_500():
    """A package's ``__init__`` exports its public names (at most 80 lines), and a module over 500
    lines is split where it holds more than one idea (none is today; one that is one idea past 500
    lines would say why in its docstring's first paragraph, and be named here)."""
    files = module_files(ROOT, "rpt").values()
    long_inits = {str(p.relative_to(ROOT)): n for p in files if p.name == "__init__.py"
                  and (n := len(p.read_text().splitlines())) > 80}
    long_modules = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text().splitlines())) > 500}
    assert long_inits == {} and long_modules == {}



MAX_SIBLINGS = 15


def sibling_counts(root) -> dict[str, int]:
    """``{package: its modules, ``__init__`` aside}`` for every package under ``root`` (a sub-package is a
    folder of its own, not a sibling module)."""
    return {str(init.parent.relative_to(Path(root).parent)):
            sum(1 for p in init.parent.glob("*.py") if p.name != "__init__.py")
            for init in sorted(Path(root).rglob("__init__.py"))}


def test_no_package_holds_more_than_15_sibling_modules():
    """A reader finds a module among at most 15 neighbours; a package past that is cut into sub-packages
    by job (docs/design.md, "Packages by job, and why")."""
    crowded = {pkg: n for pkg, n in sibling_counts(ROOT / "rpt").items() if n > MAX_SIBLINGS}
    assert crowded == {}


def test_sibling_count_on_a_hand_made_tree(tmp_path):
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    for f in ("__init__.py", "a.py", "b.py", "sub/__init__.py", "sub/c.py"):
        (pkg / f).write_text("")
    (pkg / "data").mkdir()  # a folder without __init__ is no package
    assert sibling_counts(pkg) == {"p": 2, "p/sub": 1}

MAY_IMPORT = re.compile(r"^\* \*\*`rpt/(\w+)/`\*\* \(may import: ([\w, ]+)\)", re.M)


def stated_imports() -> dict[str, set[str]]:
    """``{package: {what it may import}}`` from design.md's "(may import: ...)" statements."""
    text = " ".join(DESIGN.read_text().split("\n  "))  # a statement may wrap onto an indented line
    return {pkg: {name.strip() for name in names.split(",")} for pkg, names in MAY_IMPORT.findall(text)}


def package_of(module: str) -> str:
    """The ``rpt`` package a module is in, or "base" for ``rpt`` itself and the top's modules."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (ROOT / "rpt" / parts[1]).is_dir()) else "base"


def test_every_package_imports_only_what_design_says_it_may(graph):
    stated = stated_imports()
    packages = {p.name for p in (ROOT / "rpt").iterdir() if (p / "__init__.py").is_file()}
    assert sorted(packages - set(stated)) == []  # every package has its statement
    found = sorted(f"{a} imports {b}" for a, targets in graph.items() for b in targets
                   if package_of(a) != "base" and package_of(b) != package_of(a)
                   and package_of(b) not in stated[package_of(a)])
    assert found == []
