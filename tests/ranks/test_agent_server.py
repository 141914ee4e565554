"""A torchrun agent forked by the agent server (pipebd_core/job/agent_server.py) is the process
`subprocess.Popen` would have started: its own session, exactly its environment, its output in its log, its
exit code (a crash's, a signal's), its command line where the reaper looks; the server is a fresh interpreter
with no thread of its own, serves several threads at once, and ends with the process it serves. A server
shared through PIPEBD_AGENT_SOCKET serves several processes, each told of its own agents' ends only, and
outlives the clients that leave; where none listens at that path, a process starts its own.

Tier: a real server and real forks running a probe module (tests/forked_probe.py); every torchrun phase in
tests/ranks, tests/service and tests/chaos starts its agent this way.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from functools import partial
from pathlib import Path

import psutil
import pytest

from app.core.reaper import kill_orphans
from app.core.tables import Job
from pipebd_core.bench.conditions import tree_cpu_seconds
from pipebd_core.job import agent_server
from pipebd_core.job.processes import stop_process_tree
from tests import forked_probe

seen = forked_probe.seen
DEADLINE_S = 60  # only a hang misses it


@pytest.fixture(autouse=True)
def own_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are of the server a supervising process starts for itself: not the session's shared one
    (tests/conftest.py), which the tests of sharing below start on a path of their own."""
    monkeypatch.delenv(agent_server.SHARED_AGENTS, raising=False)


def start_probe(folder: Path, *args: str, env: dict[str, str] | None = None) -> tuple[agent_server.ServedProcess, Path]:
    return forked_probe.start_probe(agent_server.start, folder, *args, env=env)


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_an_agent_the_server_forks_runs_its_module_as_a_fresh_interpreter_would(tmp_path: Path) -> None:
    os.environ["PIPEBD_TEST_PARENT_ONLY"] = "1"  # set after the server started too: never the agent's
    try:
        env = {"PROBE": "given", "OMP_NUM_THREADS": "2", "PYTHONPATH": str(tmp_path)}
        process, log = start_probe(tmp_path, "--code", "3", env=env)
        assert process.wait(DEADLINE_S) == 3 and process.returncode == 3
    finally:
        del os.environ["PIPEBD_TEST_PARENT_ONLY"]
    probe = seen(tmp_path)
    assert probe["pid"] == process.pid and probe["sid"] == process.pid  # a session of its own
    assert probe["environ"] == env  # exactly the environment given
    assert probe["threads"] == 2 and probe["path0"] == os.getcwd()
    assert probe["argv"] == ["tests.forked_probe", str(tmp_path / "seen.json"), "--code", "3"]
    assert log.read_text().splitlines() == ["probe: to stdout", "probe: to stderr"]


def test_the_server_imports_what_a_request_preloads_once_for_every_later_request_but_never_a_users_module(
    tmp_path: Path,
) -> None:
    # a job's torchvision workload, and a module outside the installed packages and PipeBD's (a user's factory,
    # which may change while a worker's server lives on: imported afresh by each process that needs it)
    preload = ["torchvision.models", "tests.fake_profiles"]
    first, _ = forked_probe.start_probe(partial(agent_server.start, preload=preload), tmp_path / "first")
    later, _ = start_probe(tmp_path / "later")  # a later request that names nothing
    assert first.wait(DEADLINE_S) == 0 and later.wait(DEADLINE_S) == 0
    for probe in ("first", "later"):
        imported = seen(tmp_path / probe)["imported"]
        assert isinstance(imported, list) and "torchvision.models" in imported, probe
        assert "tests.fake_profiles" not in imported and "tests.forked_probe" in imported, probe


def test_a_crash_and_a_signal_end_with_the_codes_popen_gives(tmp_path: Path) -> None:
    crashed, log = start_probe(tmp_path / "crash", "--crash")
    killed, _ = start_probe(tmp_path / "kill", "--wait", str(tmp_path / "never"))
    wait_for(tmp_path / "kill" / "seen.json")
    os.kill(killed.pid, signal.SIGKILL)
    assert crashed.wait(DEADLINE_S) == 1 and killed.wait(DEADLINE_S) == -signal.SIGKILL
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "RuntimeError: the probe crashed on purpose" in text


def test_the_server_is_a_fresh_interpreter_without_a_thread_of_its_own_and_the_agents_parent(tmp_path: Path) -> None:
    release = tmp_path / "release"
    process, _ = start_probe(tmp_path, "--wait", str(release))
    try:
        wait_for(tmp_path / "seen.json")
        server = psutil.Process(agent_server.server().process.pid)
        assert psutil.Process(process.pid).ppid() == server.pid
        assert server.ppid() == os.getpid() and os.getsid(server.pid) == server.pid
        assert server.cmdline()[:3] == [sys.executable, "-m", "pipebd_core.job.agent_server"]
        assert server.num_threads() == 1  # a fork keeps only the forking thread: no other may be running
    finally:
        release.touch()
    assert process.wait(DEADLINE_S) == 0


def test_threads_starting_agents_at_once_each_get_their_own_pid_and_code(tmp_path: Path) -> None:
    # a Celery worker starts phases from its pool's threads
    codes = list(range(3, 9))
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        started = list(pool.map(lambda code: start_probe(tmp_path / str(code), "--code", str(code))[0], codes))
    assert len({process.pid for process in started}) == len(codes)
    assert [process.wait(DEADLINE_S) for process in started] == codes
    assert [seen(tmp_path / str(code))["pid"] for code in codes] == [process.pid for process in started]


def test_stopping_a_served_agent_stops_its_children_too(tmp_path: Path) -> None:
    process, _ = start_probe(tmp_path, "--wait", str(tmp_path / "never"))
    wait_for(tmp_path / "seen.json")
    assert stop_process_tree(process, grace_s=DEADLINE_S) == []  # SIGTERM was enough: nothing had to be killed
    assert process.returncode == -signal.SIGTERM and not psutil.pid_exists(process.pid)


def test_the_reaper_knows_a_served_agent_by_its_run_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "job-7"
    process, _ = start_probe(tmp_path, "--wait", str(tmp_path / "never"), "--run-dir", str(run_dir))
    wait_for(tmp_path / "seen.json")  # the probe runs: retitled
    command = " ".join([sys.executable, "-m", "tests.forked_probe", str(tmp_path / "seen.json")])
    assert " ".join(psutil.Process(process.pid).cmdline()).startswith(command)
    assert set(psutil.Process(process.pid).environ()) <= {"OMP_NUM_THREADS"}  # not the server's (PATH, HOME)
    job = Job(name="j", nproc=1, queue="q", spec={}, host="here", pid=process.pid, run_dir=str(run_dir))
    try:
        assert kill_orphans(job, "here") == [process.pid]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
    assert process.wait(DEADLINE_S) == -signal.SIGKILL


def test_the_server_ends_with_the_process_it_serves_and_its_agents_run_on(tmp_path: Path) -> None:
    release = tmp_path / "release"
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from pipebd_core.job import agent_server
        folder = Path({str(tmp_path)!r})
        command = [sys.executable, "-m", "tests.forked_probe", str(folder / "seen.json"), "--wait", {str(release)!r}]
        with (folder / "launcher.log").open("ab") as log:
            process = agent_server.start(command, {{"OMP_NUM_THREADS": "1"}}, log)
        print(agent_server.server().process.pid, process.pid, flush=True)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=DEADLINE_S)
    assert done.returncode == 0, done.stderr
    server_pid, agent_pid = (int(word) for word in done.stdout.split())
    try:
        assert not psutil.pid_exists(server_pid)  # ended and reaped by the process it served, at its exit
        assert psutil.Process(agent_pid).status() != psutil.STATUS_ZOMBIE  # the agent runs on
    finally:
        release.touch()
    wait_for(tmp_path / "seen.json")
    assert seen(tmp_path)["pid"] == agent_pid


def test_fresh_agents_when_asked_or_for_a_command_the_server_cannot_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with (tmp_path / "log").open("ab") as log:
        assert agent_server.start(["/bin/true"], {}, log) is None
        monkeypatch.setenv(agent_server.FRESH_AGENTS, "1")
        assert agent_server.start([sys.executable, "-m", "tests.forked_probe", str(tmp_path / "x")], {}, log) is None


def test_a_served_agents_cpu_counts_as_the_supervisors_own_tree(tmp_path: Path) -> None:
    # a bench reads its runs' load as the node's CPU less its own tree's: an agent the server forked is not the
    # bench's child, and was counted as another process's (every run of a bench then read as shared)
    before = tree_cpu_seconds()
    loop = "sum(range(3 * 10**7))"  # timed by its process time (-p): the CPU it used, in seconds
    command = [sys.executable, "-m", "timeit", "-p", "-u", "sec", "-n", "1", "-r", "1", loop]
    log = tmp_path / "launcher.log"
    with log.open("ab") as stream:
        process = agent_server.start(command, {"OMP_NUM_THREADS": "1"}, stream)
    assert process is not None and process.wait(DEADLINE_S) == 0, log.read_text()
    burnt = float(log.read_text().split("best of 1:")[1].split()[0])  # "1 loop, best of 1: 0.458 sec per loop"
    assert tree_cpu_seconds() - before >= burnt > 0.1


SHARED_CLIENT = """
import sys
from pathlib import Path
from pipebd_core.job import agent_server
folder = Path(sys.argv[1])
command = [sys.executable, "-m", "tests.forked_probe", str(folder / "seen.json"), "--code", "4"]
with (folder / "launcher.log").open("ab") as log:
    process = agent_server.start(command, {"OMP_NUM_THREADS": "1"}, log)
print(process.pid, process.wait(60), agent_server.server().process is None, flush=True)
"""


def test_processes_naming_a_shared_server_fork_their_agents_from_it_each_told_of_its_own_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "agents.sock")
    shared = agent_server.share(path)
    assert shared.process is not None
    try:
        monkeypatch.setenv(agent_server.SHARED_AGENTS, path)
        ours, _ = start_probe(tmp_path / "ours", "--wait", str(tmp_path / "release"))
        (tmp_path / "theirs").mkdir()
        done = subprocess.run(
            [sys.executable, "-c", SHARED_CLIENT, str(tmp_path / "theirs")],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
        )
        assert done.returncode == 0, done.stderr
        their_pid, their_code, connected = done.stdout.split()
        assert (their_code, connected) == ("4", "True")  # its own code, from the shared server it connected to
        assert seen(tmp_path / "theirs")["pid"] == int(their_pid)
        assert psutil.Process(ours.pid).ppid() == shared.process.pid  # forked by the shared server too
        assert ours.poll() is None  # the other process's agent ended: this one's did not
        (tmp_path / "release").touch()
        assert ours.wait(DEADLINE_S) == 0
        later, _ = start_probe(tmp_path / "later", "--code", "5")  # the server outlived the client that left
        assert later.wait(DEADLINE_S) == 5
    finally:
        shared.close()
    assert shared.process.wait(DEADLINE_S) == 0  # ends when the process that started it closes its end


def test_where_nothing_listens_at_the_shared_path_a_process_starts_its_own_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(agent_server.SHARED_AGENTS, str(tmp_path / "nobody.sock"))
    process, _ = start_probe(tmp_path, "--code", "6")
    assert process.wait(DEADLINE_S) == 6
    own = agent_server.server().process
    assert own is not None and psutil.Process(own.pid).ppid() == os.getpid()
