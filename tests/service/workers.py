"""Real worker processes (`pipebd worker`) for the tests, and waiting on what they do."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from sqlmodel import Session

from app.core.database import get_engine
from app.core.settings import Settings
from app.core.tables import Worker

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120


def service_env(settings: Settings) -> dict[str, str]:
    """The PIPEBD_* variables that make a subprocess use the same database, broker and folders."""
    return {
        "PIPEBD_DATA_DIR": str(settings.data_dir),
        "PIPEBD_DATABASE_URL": settings.database,
        "PIPEBD_BROKER_URL": settings.broker,
        "PIPEBD_DATA_ROOTS": settings.data_roots,
        "PIPEBD_HEARTBEAT_S": "0.5",
        "PIPEBD_POLL_S": "0.1",
        "PIPEBD_KILL_GRACE_S": "3",
        "PIPEBD_CACHE_DIR": str(settings.data_dir / "cache"),
    }


@dataclass
class WorkerProcess:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_worker(
    settings: Settings,
    name: str,
    devices: int,
    extra_env: dict[str, str] | None = None,
    imports_asked_in: Path | None = None,
    wait: bool = True,
) -> WorkerProcess:
    """`pipebd worker` in a subprocess; returns once it has announced itself and Celery is consuming (`wait`),
    else at once: `wait_ready` then waits for it (several workers started together start side by side).
    `imports_asked_in`: the worker also answers there which heavy packages it imported (heavy_imports.py)."""
    log = settings.data_dir / f"worker-{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **service_env(settings), **(extra_env or {})}
    probe = [] if imports_asked_in is None else ["tests.service.heavy_imports", str(imports_asked_in)]
    command = [sys.executable, "-m", *probe, "app.cli", "worker", "--name", name, "--devices", str(devices)]
    with log.open("wb") as handle:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT)
    worker = WorkerProcess(name, process, log)
    if wait:
        wait_ready(settings, worker)
    return worker


def wait_ready(settings: Settings, worker: WorkerProcess) -> None:
    """Until the worker has announced itself and Celery is consuming."""
    wait_for(lambda: _ready(settings, worker), START_TIMEOUT_S, f"worker {worker.name} to start", worker.output)


def _ready(settings: Settings, worker: WorkerProcess) -> bool:
    if worker.process.poll() is not None:
        raise RuntimeError(f"worker {worker.name} exited with {worker.process.returncode}:\n{worker.output()}")
    with Session(get_engine(settings.database)) as session:
        announced = session.get(Worker, worker.name) is not None
    return announced and " ready." in worker.output()


def wait_for(condition: Callable[[], Any], timeout: float, what: str, context: Callable[[], str] = str) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{context()}")


def rank_processes(run_dir: str) -> list[psutil.Process]:
    """Live processes of a job: torchrun and its ranks name the run directory on their command line."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if run_dir in " ".join(process.info["cmdline"] or []) and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.NoSuchProcess:
            continue
    return found
