"""Fixtures of the service tier: real SQLite and PostgreSQL databases, a real broker, the real app, and
one embedded service (the app and a real `pipebd worker` on SQLite) shared by the tests that run jobs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from app.core.database import get_engine
from app.core.settings import Settings
from app.main import create_app
from tests.service.heavy_imports import ask
from tests.service.services import Service, create_database, drop_database, start_postgres, start_redis
from tests.service.workers import WorkerProcess, start_worker, wait_for

REDIS_TEST_DB = 13  # a database number of its own (one per xdist worker above it), flushed before and after each test


@pytest.fixture(scope="session")
def postgres_service() -> Iterator[Service]:
    service = start_postgres()
    yield service
    service.stop()


@pytest.fixture(scope="session")
def redis_service() -> Iterator[Service]:
    service = start_redis()
    yield service
    service.stop()


@pytest.fixture
def postgres_url(postgres_service: Service) -> Iterator[str]:
    """A fresh empty PostgreSQL database for one test."""
    if postgres_service.url is None:
        pytest.skip(postgres_service.reason)
    url = create_database(postgres_service.url)
    yield url
    get_engine(url).dispose()
    drop_database(postgres_service.url, url)


def xdist_number() -> int:
    """This test process's number under pytest-xdist (0 without it)."""
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)


@pytest.fixture
def redis_url(redis_service: Service) -> Iterator[str]:
    if redis_service.url is None:
        pytest.skip(redis_service.reason)
    url = f"{redis_service.url}/{REDIS_TEST_DB + xdist_number()}"
    redis.Redis.from_url(url).flushdb()
    yield url
    redis.Redis.from_url(url).flushdb()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'pipebd.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


def make_settings(tmp_path: Path, database_url: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "data_dir": tmp_path / "data",
        "database_url": database_url,
        "broker_url": f"sqla+sqlite:///{tmp_path / 'broker.db'}",
        "data_roots": str(tmp_path / "datasets"),
        "sse_poll_s": 0.05,
        # one test process creates many apps, all sharing its spec checkers (app/services/preflight.py): kept
        # between tests instead of each idle minute's gap starting another (3-4 s of CPU, importing torch)
        "spec_checker_idle_s": 900.0,
        **overrides,
    }
    return Settings(**values)  # type: ignore[arg-type]


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    return make_settings(tmp_path, database_url)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@dataclass
class Embedded:
    """The app (in-process) and one real worker process sharing a SQLite database and broker."""

    client: TestClient
    settings: Settings
    worker: WorkerProcess
    imports_asked_in: Path | None = None  # where the worker answers which heavy packages it imported

    def job_dir(self, job_id: int) -> Path:
        return self.settings.runs / f"job-{job_id}"

    def worker_imported(self) -> list[str]:
        """Which of torch, torchvision and transformers the worker's own process has imported so far."""
        assert self.imports_asked_in is not None, "this worker was started without heavy_imports"
        return ask(self.imports_asked_in)

    def wait_state(self, job_id: int, states: set[str], timeout: float) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            job: dict[str, Any] = self.client.get(f"/api/v1/jobs/{job_id}").json()
            return job if job["state"] in states else None

        found: dict[str, Any] = wait_for(
            reached, timeout, f"job {job_id} to reach {states}", lambda: self.worker.output()[-3000:]
        )
        return found


@pytest.fixture(scope="session")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Embedded]:
    """One worker advertising 3 devices, with PIPEBD_INJECT_FAULT="2:1": rank 2 raises at step 1, so 1- and
    2-rank jobs are unaffected and a 3-rank job is the crash test. Its data roots are a default server's (the
    bundled examples' folders of the checkout, as `make run`), so that the bundled examples run on it. The
    worker also answers which heavy packages its own process imported (`Embedded.worker_imported`)."""
    folder = tmp_path_factory.mktemp("embedded")
    settings = make_settings(folder, f"sqlite:///{folder / 'pipebd.db'}", data_roots="")  # the default roots
    with TestClient(create_app(settings)) as client:
        probe = folder / "worker-imports"
        worker = start_worker(
            settings, "embedded", devices=3, extra_env={"PIPEBD_INJECT_FAULT": "2:1"}, imports_asked_in=probe
        )
        try:
            yield Embedded(client, settings, worker, probe)
        finally:
            worker.stop()
