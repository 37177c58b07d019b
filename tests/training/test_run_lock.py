"""One trainer per output_dir (rpt/training/run_dir/lock.py): a live holder stops a second trainer, whichever of two
simultaneous starters wins; a dead holder's lock (its process gone on this host, or no heartbeat
for STALE_S on another) is taken over with a note; --break-lock takes any lock."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from rpt.training.config import ConfigError
from rpt.training.run_dir import lock as run_lock
from rpt.training.run_dir.lock import LOCK_NAME, STALE_S, release_run_lock, take_run_lock
from tests.helpers.inprocess_train import one_error_line, train_main
from tests.helpers.train_helpers import ROOT, env, write_config


def plant(directory, **record) -> str:
    """A lock as another trainer would have written it."""
    now = time.time()
    path = os.path.join(directory, LOCK_NAME)
    with open(path, "w") as f:
        json.dump({"host": "node-7", "pid": 4242, "pid_start": None, "token": "theirs", "started": now,
                   "heartbeat": now, **record}, f)
    return path


@pytest.fixture
def sleeper():
    """A live process on this host, standing in for another trainer."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_live_trainer_on_this_host_holds_the_lock_until_its_process_is_gone(tmp_path, sleeper, capsys):
    lock = plant(tmp_path, host=socket.gethostname(), pid=sleeper.pid, pid_start=run_lock._proc_start(sleeper.pid))
    with pytest.raises(ConfigError, match=f"pid {sleeper.pid}, heartbeat 0 s ago"):
        take_run_lock(str(tmp_path))
    assert json.load(open(lock))["token"] == "theirs"
    os.kill(sleeper.pid, signal.SIGKILL)
    sleeper.wait()
    take_run_lock(str(tmp_path))
    assert f"its process {sleeper.pid} on this host is gone" in capsys.readouterr().out
    assert json.load(open(lock))["pid"] == os.getpid()
    take_run_lock(str(tmp_path))  # this process holds it already: a second run in one process
    release_run_lock(str(tmp_path))
    assert not os.path.exists(lock)


def test_a_reused_pid_is_not_the_holder(tmp_path, sleeper):
    """The holder's pid now belongs to another process (another start time): the lock is stale."""
    plant(tmp_path, host=socket.gethostname(), pid=sleeper.pid, pid_start=1)
    take_run_lock(str(tmp_path))
    release_run_lock(str(tmp_path))


def test_another_hosts_lock_is_stale_only_without_a_heartbeat_and_break_lock_takes_any(tmp_path, capsys):
    plant(tmp_path)  # node-7, heartbeat now
    with pytest.raises(ConfigError, match="'node-7' pid 4242.*--break-lock"):
        take_run_lock(str(tmp_path))
    take_run_lock(str(tmp_path), force=True)
    assert "--break-lock" in capsys.readouterr().out
    release_run_lock(str(tmp_path))
    plant(tmp_path, heartbeat=time.time() - STALE_S - 5)  # a job that died on another node
    take_run_lock(str(tmp_path))
    assert f"no heartbeat for {STALE_S + 5:.0f} s" in capsys.readouterr().out
    release_run_lock(str(tmp_path))


def test_an_unreadable_lock_is_being_written_until_it_is_old(tmp_path):
    path = tmp_path / LOCK_NAME
    path.write_text("")
    with pytest.raises(ConfigError, match="still writing its lock"):
        take_run_lock(str(tmp_path))
    old = time.time() - STALE_S - 5
    os.utime(path, (old, old))
    take_run_lock(str(tmp_path))
    release_run_lock(str(tmp_path))


STARTER = """
import sys, time
from rpt.training.config import ConfigError
from rpt.training.run_dir.lock import take_run_lock
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
try:
    take_run_lock(sys.argv[1])
    print("won", flush=True)
    time.sleep(0.5)
except ConfigError:
    print("lost", flush=True)
"""


def test_two_trainers_started_at_once_exactly_one_wins(tmp_path):
    go = time.time() + 1.0  # every starter sleeps until the same instant, then races for its directory's lock
    races = {tmp_path / f"out{i}": [] for i in range(2)}
    for directory, procs in races.items():
        directory.mkdir()
        procs += [subprocess.Popen([sys.executable, "-c", STARTER, str(directory), str(go)], cwd=ROOT, env=env(),
                                   stdout=subprocess.PIPE, text=True) for _ in range(2)]
    for directory, procs in races.items():
        assert sorted(p.communicate(timeout=60)[0].strip() for p in procs) == ["lost", "won"]
        assert not (directory / LOCK_NAME).exists()  # the winner released it at exit


def test_train_stops_at_a_held_output_dir_and_break_lock_takes_it(tmp_path, sleeper, capsys):
    cfg = write_config(tmp_path, max_steps=2, save_every=2, eval_batches=0, warmup_steps=1)
    run = tmp_path / "run"
    run.mkdir()
    lock = plant(run, host=socket.gethostname(), pid=sleeper.pid, pid_start=run_lock._proc_start(sleeper.pid))
    before = open(lock).read()
    assert train_main(cfg) == 2
    assert f"pid {sleeper.pid}" in one_error_line(capsys.readouterr().err)
    assert sorted(os.listdir(run)) == [LOCK_NAME] and open(lock).read() == before  # nothing read or written
    (run / "run_summary.txt").mkdir()  # stops the run right after the lock: the flag's wiring, without training
    assert train_main(cfg, "--break-lock") == 2
    captured = capsys.readouterr()
    assert "took over" in captured.out and "run_summary.txt is a directory" in one_error_line(captured.err)
    assert not (run / LOCK_NAME).exists()  # released when the run failed
