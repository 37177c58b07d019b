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

from rpt.training.config import load_config
from tests.helpers.scripts import ROOT, load_script

DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PLACEHOLDER = re.compile(r"\b(DIR|F\.json|X\.yaml|NAME|P)\b|\$")


def bash_commands(path) -> list[str]:
    """Each shell line of ``path``'s ```bash blocks, in order, continuation lines joined."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", path.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()  # a trailing comment
            if line and not line.startswith("#"):
                found.append(line)
    return found


def commands() -> list[tuple[str, str]]:
    """``(file, command)`` for each shell line in ```bash blocks and each inline `python ...` span."""
    found = []
    for path in DOC_FILES:
        found += [(path.name, line) for line in bash_commands(path)]
        for span in re.findall(r"`((?:python|accelerate launch) [^`]+)`", path.read_text()):
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
        path = ROOT / tokens[tokens.index("-m") + 1].replace(".", "/")
        assert path.with_suffix(".py").is_file() or (path / "__main__.py").is_file(), command  # a module or a package
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


# ---- after `make demo`: what the commands read exists ---------------------------------------------
def demo_checkpoints() -> set[str]:
    """The ``final/`` directories ``make demo`` (``python -m rpt.demo --out runs/demo``) writes."""
    from pathlib import Path

    from rpt.demo import fine_tune_commands

    names = ["ar_c", *fine_tune_commands(Path("runs/demo"), "runs/demo/ar_c/final", 1, [0, 1])]
    return {f"runs/demo/{name}/final" for name in names}


def reads_and_writes(tokens: list[str]) -> tuple[list[str], list[str]]:
    """The model directories a documented command reads and the run directories it writes."""
    script = script_of(tokens)
    if script is None:
        return [], []
    after = tokens[tokens.index(script) + 1:]
    reads = [after[i + 1] for i, t in enumerate(after[:-1]) if t == "--checkpoint"]
    writes = [after[i + 1] for i, t in enumerate(after[:-1]) if t == "--out"]
    if script == "merge_lora.py":
        positional = [t for t in after if not t.startswith("-")]
        reads, writes = reads + positional[:1], writes + positional[1:2]
    if script == "train.py" and "--config" in after:
        overrides = [t for t in after if "=" in t and not t.startswith("-")]
        cfg = load_config(str(ROOT / after[after.index("--config") + 1]), overrides)
        reads += [cfg.init_from] if cfg.init_from else []
        writes.append(f"{cfg.output_dir}/final")
    return reads, writes


@pytest.mark.parametrize("doc", DOC_FILES, ids=[p.name for p in DOC_FILES])
def test_every_checkpoint_a_command_reads_exists_after_the_demo(doc):
    """In each file's order: a command reads only what the demo or an earlier command wrote."""
    written = demo_checkpoints()
    lines = [c for name, c in DOC_COMMANDS if name == doc.name]
    for command in lines:
        if PLACEHOLDER.search(command) or command.startswith(("make", "vllm")):
            continue
        reads, writes = reads_and_writes(shlex.split(re.sub(r"\[(--[^\]]*)\]", r"\1", command)))
        missing = [r for r in reads if not any(r == w or r.startswith(w.rstrip("/") + "/") for w in written)]
        assert not missing, f"{doc.name}: `{command}` reads {missing}, which neither `make demo` nor an earlier command writes"
        written |= set(writes)


def test_the_readme_commands_read_the_demo_checkpoints():
    reads = [r for c in bash_commands(ROOT / "README.md") if not c.startswith(("make", "accelerate"))
             for r in reads_and_writes(shlex.split(c))[0]]
    assert {"runs/demo/rpt/final", "runs/demo/ar_c/final"} <= set(reads)


def test_every_config_key_is_documented():
    """Every key of rpt/training/config.py in docs/training.md, every nested key of rpt/training/config_keys.py in
    docs/training.md or docs/data.md (as `key` or `key:`)."""
    from rpt.training import config_keys
    from rpt.training.config import FIELDS

    training = (ROOT / "docs" / "training.md").read_text()
    both = training + (ROOT / "docs" / "data.md").read_text()

    def named(key: str, text: str) -> bool:  # a word of a code block or `span` (`key`, `{path: F, text_field}`)
        blocks = re.findall(r"```.*?```", text, flags=re.S)
        spans = blocks + re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
        return any(re.search(rf"(?<![\w.]){re.escape(key)}(?![\w(])", span) for span in spans)

    missing = [k for k in FIELDS if not named(k, training)]
    assert not missing, f"docs/training.md omits the config keys {missing}"
    nested = set().union(*config_keys.SOURCE_KEYS.values(), config_keys.COMMON_SOURCE_KEYS, config_keys.STDLIB_KEYS,
                         config_keys.TRAIN_BPE_KEYS)
    missing = sorted(k for k in nested if not named(k, both))
    assert not missing, f"docs/training.md and docs/data.md omit the nested config keys {missing}"


# ---- the README's commands, run in order after a miniature demo ----------------------------------
@pytest.mark.slow
def test_readme_commands_run_after_a_demo(tmp_path):
    """Every README command (``make`` and the multi-node launch aside) exits 0 in a scratch copy of
    the repository after a miniature ``make demo`` (tests/helpers/scripts.py: micro models, a few steps;
    the evaluations on one problem each)."""
    import subprocess

    from tests.helpers.scripts import scratch_repo, short_demo, shortened
    from tests.helpers.train_helpers import env

    repo = scratch_repo(tmp_path)
    environment = env()
    short_demo(repo, environment)
    ran = []
    for command in bash_commands(ROOT / "README.md"):
        if command.startswith(("make ", "accelerate launch")):
            continue
        tokens = shortened(shlex.split(command), repo)
        if tokens[0] == "python":
            tokens[0] = sys.executable
        res = subprocess.run(tokens, cwd=repo, env=environment, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, f"`{command}` exited {res.returncode}:\n{res.stderr[-3000:]}"
        ran.append(command)
    assert any("eval/table1.py" in c for c in ran) and any("merge_lora.py" in c for c in ran)
    assert (repo / "runs" / "lora" / "merged" / "config.json").is_file()
    assert (repo / "runs" / "first" / "finetune" / "final").is_dir()
