"""The commands the README and docs/ show: every script exists, every flag is one its ``--help``
lists, and every ``train.py`` / ``prepare_data.py`` config plus its ``key=value`` overrides loads.

The commands themselves train or evaluate for minutes on real checkpoints; what runs in seconds is
exercised by the tests of each script. This catches the docs drifting from the code.
"""

import contextlib
import io
import re
import shlex
import sys

import pytest

from rpt.config import load_config
from tests.scripts import ROOT, load_script

DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PLACEHOLDER = re.compile(r"\b(DIR|F\.json|X\.yaml|NAME|P)\b|\$")


def commands() -> list[tuple[str, str]]:
    """``(file, command)`` for each shell line in ```bash blocks and each inline `python ...` span."""
    found = []
    for path in DOC_FILES:
        text = path.read_text()
        for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()  # a trailing comment
                if line and not line.startswith("#"):
                    found.append((path.name, line))
        for span in re.findall(r"`((?:python|accelerate launch) [^`]+)`", text):
            found.append((path.name, span))
    return found


def script_of(tokens: list[str]) -> str | None:
    for t in tokens:
        if t.endswith(".py") and not t.startswith("-"):
            return t
    return None


@pytest.fixture(scope="module")
def help_texts():
    cache = {}

    def get(script: str) -> str:
        if script not in cache:
            module = load_script(script)
            out, argv = io.StringIO(), sys.argv
            sys.argv = [script, "--help"]  # the benchmarks parse sys.argv
            try:
                with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
                    module.main()
            finally:
                sys.argv = argv
            cache[script] = out.getvalue()
        return cache[script]

    return get


DOC_COMMANDS = commands()


def test_the_docs_show_commands():
    assert len(DOC_COMMANDS) > 40
    assert {name for name, _ in DOC_COMMANDS} >= {"README.md", "training.md", "sampling.md", "evaluation.md"}


@pytest.mark.parametrize("where,command", DOC_COMMANDS, ids=[f"{n}:{c[:40]}" for n, c in DOC_COMMANDS])
def test_doc_command_matches_the_code(where, command, help_texts):
    tokens = shlex.split(re.sub(r"\[(--[^\]]*)\]", r"\1", command))  # "[--batch 8]": an optional flag
    if tokens[0] == "make":
        assert re.search(rf"^{tokens[1]}:", (ROOT / "Makefile").read_text(), flags=re.M), command
        return
    if "-m" in tokens:
        module = tokens[tokens.index("-m") + 1]
        assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), command
        return
    script = script_of(tokens)
    if script is None or "*" in script:
        return  # e.g. `python eval/*.py`: a family, not a command
    assert (ROOT / script).is_file(), f"{where}: {command}: no {script}"
    after = tokens[tokens.index(script) + 1:]
    if script != "eval/lm_eval.py":  # lm-eval's own flags, checked by lm-eval
        flags = {t.split("=")[0] for t in after if t.startswith("--")}
        listed = help_texts(script)
        missing = [f for f in flags if not re.search(rf"{re.escape(f)}\b", listed)]
        assert not missing, f"{where}: {command}: {script} --help does not list {missing}"
    if script in ("train.py", "prepare_data.py") and "--config" in after and not PLACEHOLDER.search(command):
        config = after[after.index("--config") + 1]
        overrides = [t for t in after if "=" in t and not t.startswith("-")]
        load_config(str(ROOT / config), overrides)  # raises ConfigError naming a bad key
