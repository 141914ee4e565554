"""Test-wide settings and shared runs.

Profiles are cached in a folder of this test session, never in ~/.cache. `finished_run` runs a spec
through torchrun once per session (across the test processes), so tests that only read a run's outputs
share it; `shared_text` is the transformer tests' text folder, one path for the session, so that a spec
naming it is the same spec (the same run) in every test file.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from pipebd_core.job import agent_server
from pipebd_core.planning.profiles import CACHE_ENV
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec
from tests.helpers import run_job
from tests.transformer_specs import write_text

# One thread per process, as every rank runs (pipebd_core/job/processes.py): the reference loops a test
# runs in its own process would otherwise spin two OpenMP threads against the ranks and the other test
# process on 2 cores (the re-plan test's 1,600-step reference took 283 s beside the suite, 44 s alone).
os.environ["OMP_NUM_THREADS"] = "1"  # the services and CLIs the tests start
torch.set_num_threads(1)

# Ctrl-C as the tests send it (SIGINT to `pipebd run`, `pipebd up`) must reach the processes they start. A
# shell without job control starts a background command with SIGINT ignored, and Python then leaves it
# ignored, in this process and in every process it starts: those tests would hang. Restored here (a
# handler is reset to the default in a child), so the suite passes however it was started.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

SHARED_SERVER = pytest.StashKey[tuple[agent_server.AgentServer, Path]]()


# The heaviest files first (seconds of setup and calls per file, `--durations` on the slower 2-core machines),
# each file kept on one test process (`--dist loadfile`), so the two processes end together: xdist's own
# order (`--no-loadscope-reorder` turns it off) queues the files with the most tests first, which left the
# single slow tests (the fuzzer, the chaos outages, the examples) to the end, one process running them alone.
# A file not listed keeps its place after these (the many quick ones fill the end).
HEAVIEST_FIRST = [
    "tests/service/test_multinode_service.py",  # 180 s
    "tests/ranks/test_finetune.py",  # 170 s
    "tests/ranks/test_nas.py",  # 145 s
    "tests/chaos/test_embedded.py",  # 120 s
    "tests/ranks/test_replan.py",  # 120 s
    "tests/ranks/test_failures.py",  # 115 s
    "tests/ranks/test_equivalence_transformer.py",  # 110 s
    "tests/service/test_phases.py",  # 95 s
    "tests/service/test_example_chains.py",  # 95 s (alone: 101 + 63 s CPU, the ViT chain and the Llama search)
    "tests/web/test_models_page.py",  # 95 s (estimated from 83 s alone: the chain, its search's page, choosing)
    "tests/ranks/test_equivalence.py",  # 90 s
    "tests/ranks/test_vision_transformer.py",  # 85 s
    "tests/service/test_worker.py",  # 85 s
    "tests/fuzz/test_schemathesis.py",  # 75 s
    "tests/chaos/test_launcher_faults.py",  # 70 s
    "tests/ranks/test_multinode.py",  # 65 s
    "tests/ranks/test_finetune_transformer.py",  # 65 s
    "tests/service/test_redis_workers.py",  # 60 s
    "tests/ranks/test_resume.py",  # 60 s
    "tests/chaos/test_broker_outage.py",  # 50 s
    "tests/ranks/test_auto.py",  # 40 s
    "tests/ranks/test_examples.py",  # 35 s
    "tests/service/test_e2e.py",  # 35 s
    "tests/service/test_hardening.py",  # 30 s
    "tests/service/test_tracking.py",  # 30 s
    "tests/ranks/test_moved.py",  # 30 s
    "tests/ranks/test_equivalence_batchnorm.py",  # 30 s
    "tests/ranks/test_batchnorm.py",  # 25 s
    "tests/chaos/test_database_outage.py",  # 17 s
    "tests/ranks/test_bench.py",  # 17 s
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Queue the heaviest files first (a stable sort: a file's tests keep their order)."""
    rank = {path: place for place, path in enumerate(HEAVIEST_FIRST)}
    root = config.rootpath
    items.sort(key=lambda item: rank.get(item.path.relative_to(root).as_posix(), len(rank)))


def pytest_configure(config: pytest.Config) -> None:
    """One agent server for the whole session (job/agent_server.py `share`), started by the controlling process
    before pytest-xdist starts its test processes, which inherit PIPEBD_AGENT_SOCKET as the workers, APIs and
    CLIs they start do: every supervising process then forks its agents from it instead of starting its own (4-5
    s of CPU each, importing torch and a job's workload; a suite started 42). It imports nothing until the first
    job asks. Tests that start services without the service's PIPEBD_ variables (tests/chaos/embedded.py), and
    the agent server's own tests, keep a server of their own, as a deployed worker has."""
    if hasattr(config, "workerinput") or os.environ.get(agent_server.SHARED_AGENTS) or only_unit_tests(config):
        return
    folder = Path(tempfile.mkdtemp(prefix="pipebd-agents-"))
    path = str(folder / "agents.sock")
    config.stash[SHARED_SERVER] = (agent_server.share(path), folder)
    os.environ[agent_server.SHARED_AGENTS] = path


def only_unit_tests(config: pytest.Config) -> bool:
    """Whether this session runs only tests/unit, which starts no process (tests/unit/conftest.py)."""
    unit = Path(__file__).resolve().parent / "unit"
    return all(Path(arg.split("::")[0]).resolve().is_relative_to(unit) for arg in config.args)


def pytest_unconfigure(config: pytest.Config) -> None:
    shared = config.stash.get(SHARED_SERVER, None)
    if shared is not None:
        server, folder = shared
        os.environ.pop(agent_server.SHARED_AGENTS, None)
        server.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def isolated_profile_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("profile-cache")
    saved = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(folder)  # inherited by the CLI and torchrun processes the tests start
    yield folder
    if saved is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = saved


def shared_runs_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every test process of this session sees: under pytest-xdist each worker's base temporary
    folder is `<session>/popen-gwN`, so the session's is its parent; alone, the base folder itself."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-runs"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., RunDir]:
    """Run a spec once per test session, in whichever test process asks first (keyed by the spec's JSON
    and `until`, under a file lock, so the other process waits and reuses it), and return its run
    directory; the run must succeed. Tests read these runs and never change them. `until`: the last
    phase to run (DISTILL: its students are read from the checkpoints, `checkpointed_students`)."""
    folder = shared_runs_folder(tmp_path_factory)

    def run(spec: Spec, until: str | None = None) -> RunDir:
        key = hashlib.sha256(f"{spec.model_dump_json()} {until}".encode()).hexdigest()[:16]
        done, out = folder / f"{key}.done", folder / key / "run"
        with open(folder / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if the run fails
            if not done.exists():
                code, run_dir = run_job(spec, out, until=until)
                assert code == 0, run_dir.events.read_text()[-3000:]
                done.touch()
        return RunDir(out)

    return run


@pytest.fixture(scope="session")
def shared_text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/transformer_specs.py's text folder, written once per session (across the test processes, under a
    file lock): the transformer specs of several test files name it, and `finished_run` shares their runs."""
    folder = shared_runs_folder(tmp_path_factory) / "text"
    with open(folder.parent / "text.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not folder.exists():
            write_text(folder.with_name("text.partial")).rename(folder)
    return folder
