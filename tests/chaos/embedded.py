"""`pipebd up` for the chaos tier: started (and started again) on one data folder, its worker found by
its command line, its database read directly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from sqlmodel import Session, select

from app.core.database import get_engine
from app.core.tables import JobMetric
from pipebd_core.documents.telemetry import EvalLine
from pipebd_core.rundir import RunDir
from tests.service.services import free_port
from tests.service.workers import REPO, wait_for

UP_ENV = {
    "PIPEBD_POLL_S": "0.1",
    "PIPEBD_HEARTBEAT_S": "0.5",
    "PIPEBD_REAPER_INTERVAL_S": "0.5",
    "PIPEBD_KILL_GRACE_S": "3",
    "PIPEBD_WORKER_DEVICES": "4",
    "PIPEBD_WORKER_SLOTS": "2",  # two 2-rank jobs at once
    "PIPEBD_FACTORY_ALLOWLIST": "pipebd_core.workloads,tests.service.slow_data",
}


@dataclass
class Up:
    """One data folder served by `pipebd up`, which may be stopped and started again."""

    folder: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    env: dict[str, str] = field(default_factory=dict)  # more of the environment of `pipebd up` and its ranks

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.folder / f"up-{self.starts}.log"

    @property
    def database(self) -> str:
        return f"sqlite:///{self.folder / 'data' / 'pipebd.db'}"

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def start(self) -> None:
        self.starts += 1
        env = {key: value for key, value in os.environ.items() if not key.startswith("PIPEBD_")}
        env.update({"PIPEBD_CACHE_DIR": os.environ.get("PIPEBD_CACHE_DIR", ""), **UP_ENV, **self.env})
        env["PYTHONPATH"] = str(REPO)
        command = [
            sys.executable,
            "-m",
            "app.cli",
            "up",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.folder / "data"),
        ]
        with self.log.open("wb") as handle:
            self.process = subprocess.Popen(command, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT)
        wait_for(lambda: "dashboard and API at" in self.output(), 120, "pipebd up", self.output)

    def stop(self) -> int:
        """Ctrl-C, as an operator stops it; its exit code."""
        assert self.process is not None
        self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(timeout=300)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise

    def worker(self) -> psutil.Process:
        assert self.process is not None
        for child in psutil.Process(self.process.pid).children():
            if "worker" in child.cmdline():
                return child
        raise AssertionError(f"no worker under pipebd up\n{self.output()[-3000:]}")

    def get(self, path: str) -> Any:
        return httpx.get(f"{self.url}{path}", timeout=30).json()

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", timeout=60, **kwargs)

    def wait_state(self, job_id: int, states: set[str], timeout: float = 180) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            job: dict[str, Any] = self.get(f"/api/v1/jobs/{job_id}")
            return job if job["state"] in states else None

        found: dict[str, Any] = wait_for(
            reached, timeout, f"job {job_id} to reach {states}", lambda: self.output()[-4000:]
        )
        return found

    def telemetry(self, job_id: int) -> list[tuple[int, int]]:
        return telemetry_rows(self.database, job_id)


def telemetry_rows(database: str, job_id: int) -> list[tuple[int, int]]:
    """(rank, seq) of every distill telemetry row stored for the job."""
    query = select(JobMetric.rank, JobMetric.seq).where(JobMetric.job_id == job_id, JobMetric.phase == "distill")
    with Session(get_engine(database)) as session:
        return [(int(rank), int(seq)) for rank, seq in session.exec(query).all()]


def assert_steps_once(rows: list[tuple[int, int]], reference: RunDir, nproc: int) -> None:
    """Every rank's steps stored exactly once: the seqs of the uninterrupted run's telemetry, none repeated."""
    assert {rank for rank, _ in rows} == set(range(nproc))
    for rank in range(nproc):
        expected = [line.seq for line in reference.read_telemetry(rank) if not isinstance(line, EvalLine)]
        stored = sorted(seq for r, seq in rows if r == rank)
        assert stored == sorted(expected), f"rank {rank}: stored {stored}, the uninterrupted run {sorted(expected)}"
