"""Fixtures of the service tier: real SQLite and PostgreSQL databases, a real broker, the real app."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from app.core.database import get_engine
from app.core.settings import Settings
from app.main import create_app
from tests.service.services import Service, create_database, drop_database, start_postgres, start_redis

REDIS_TEST_DB = 13  # a database number of its own, flushed before and after each test


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


@pytest.fixture
def redis_url(redis_service: Service) -> Iterator[str]:
    if redis_service.url is None:
        pytest.skip(redis_service.reason)
    url = f"{redis_service.url}/{REDIS_TEST_DB}"
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
