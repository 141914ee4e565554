"""A phase process forked warm (pipebd_core/job/forked.py) is the process `subprocess.Popen` would have started:
its own session, its environment, its output in its log, its exit code, none of the parent's sockets, and
its command line where the reaper and `ps` look for a job's processes.

Tier: real forks of the test process running a probe module (tests/forked_probe.py); the phases that fork
this way run throughout tests/ranks and tests/service.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from app.core.reaper import kill_orphans
from app.core.tables import Job
from pipebd_core.job import forked
from tests import forked_probe

seen = forked_probe.seen
DEADLINE_S = 60  # only a hang misses it


def start_probe(folder: Path, *args: str, env: dict[str, str] | None = None) -> tuple[forked.ForkedProcess, Path]:
    return forked_probe.start_probe(forked.start, folder, *args, env=env)


def test_a_forked_phase_runs_its_module_as_a_fresh_interpreter_would(tmp_path: Path) -> None:
    os.environ["PIPEBD_TEST_PARENT_ONLY"] = "1"
    try:
        env = {"PROBE": "given", "OMP_NUM_THREADS": "2", "PYTHONPATH": str(tmp_path)}
        process, log = start_probe(tmp_path, "--code", "3", env=env)
        assert process.wait(DEADLINE_S) == 3 and process.returncode == 3
    finally:
        del os.environ["PIPEBD_TEST_PARENT_ONLY"]
    probe = seen(tmp_path)
    assert probe["pid"] == process.pid and probe["sid"] == process.pid  # a session of its own
    assert probe["environ"] == env  # exactly the environment given, the parent's own variables gone
    assert probe["threads"] == 2 and probe["path0"] == os.getcwd()
    assert probe["argv"] == ["tests.forked_probe", str(tmp_path / "seen.json"), "--code", "3"]
    assert log.read_text().splitlines() == ["probe: to stdout", "probe: to stderr"]


def test_a_phase_forked_from_a_thread_pools_thread_ends_its_own_children_cleanly(tmp_path: Path) -> None:
    # a Celery worker starts phases from its pool's threads; a rank forked in turn (by the torchrun agent)
    # must not try to join that thread at its exit, which ended it with exit code 1 after its work was done
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        process, log = pool.submit(start_probe, tmp_path, "--child").result()
    assert process.wait(DEADLINE_S) == 0, log.read_text()
    assert "probe: the child ran" in log.read_text()


SIGTERM_WHILE_FORKING = threading.Event()


def sigterm_if_asked() -> None:
    if SIGTERM_WHILE_FORKING.is_set():
        os.kill(os.getpid(), signal.SIGTERM)


os.register_at_fork(before=sigterm_if_asked)


def test_a_stop_signal_during_the_fork_stops_the_caller_and_leaves_no_child(tmp_path: Path) -> None:
    # `pipebd run` and `pipebd bench` turn SIGTERM into KeyboardInterrupt; one handled inside os.fork's own
    # callbacks was printed and lost (the bench went on to the end), or left the child running
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    SIGTERM_WHILE_FORKING.set()
    try:
        with pytest.raises(KeyboardInterrupt):
            start_probe(tmp_path, "--wait", str(tmp_path / "never"))
    finally:
        SIGTERM_WHILE_FORKING.clear()
        signal.signal(signal.SIGTERM, previous)
        left = [child for child in psutil.Process().children() if "forked_probe" in " ".join(child.cmdline())]
        for child in left:  # killed here too, so that a failure leaves nothing behind
            child.kill()
    assert left == []


def test_a_crash_leaves_its_traceback_in_the_log_and_exits_1(tmp_path: Path) -> None:
    process, log = start_probe(tmp_path, "--crash")
    assert process.wait(DEADLINE_S) == 1
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "RuntimeError: the probe crashed on purpose" in text


def test_a_forked_phase_lets_go_of_the_parents_sockets(tmp_path: Path) -> None:
    # a connection of the parent (a worker's to its database) must close when the parent closes it, even
    # while the phase it forked still runs: an orphaned rank must not keep a dead worker's transaction open
    ours, peer = socket.socketpair()
    release = tmp_path / "release"
    process, _ = start_probe(tmp_path, "--wait", str(release))
    try:
        ours.close()
        peer.settimeout(DEADLINE_S)
        assert peer.recv(1) == b""  # end of file: no copy of our end lives on in the child
        assert process.poll() is None
    finally:
        release.touch()
        peer.close()
    assert process.wait(DEADLINE_S) == 0


def test_the_reaper_knows_a_forked_phase_by_its_run_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "job-7"
    process, _ = start_probe(tmp_path, "--wait", str(tmp_path / "never"), "--run-dir", str(run_dir))
    command = " ".join([sys.executable, "-m", "tests.forked_probe", str(tmp_path / "seen.json")])
    deadline = time.monotonic() + DEADLINE_S
    while not (tmp_path / "seen.json").exists() and time.monotonic() < deadline:  # the probe runs: retitled
        time.sleep(0.01)
    assert " ".join(psutil.Process(process.pid).cmdline()).startswith(command)
    assert set(psutil.Process(process.pid).environ()) <= {"OMP_NUM_THREADS"}  # not this process's (PATH, HOME)
    job = Job(name="j", nproc=1, queue="q", spec={}, host="here", pid=process.pid, run_dir=str(run_dir))
    try:
        assert kill_orphans(job, "here") == [process.pid]  # [] had it not known the process as the job's
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
    process.wait(DEADLINE_S)  # reaped here, or by the reaper's own wait
    assert not psutil.pid_exists(process.pid)


def test_a_command_that_is_not_a_module_of_this_interpreter_is_not_forked(tmp_path: Path) -> None:
    with (tmp_path / "log").open("ab") as log:
        assert forked.start(["/bin/true"], {}, log) is None
        assert forked.start([sys.executable, str(tmp_path / "script.py")], {}, log) is None


@pytest.mark.parametrize("code", [None, 0, 4, "a message"])
def test_exit_codes_are_the_interpreters(code: object) -> None:
    assert forked.exit_code(code) == {None: 0, 0: 0, 4: 4, "a message": 1}[code]  # type: ignore[index]
