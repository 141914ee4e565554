"""Real Redis and PostgreSQL for the service tests: the ones running here, or throw-away instances.

If 127.0.0.1:6379 (Redis) or 127.0.0.1:5432 (PostgreSQL, trust auth, database `test`) answers, the
tests use it. Otherwise they start a private instance (app/core/throwaway.py) and stop it afterwards.
When neither is possible the caller skips with the reason returned here: a test is never passed silently
without its component.
"""

from __future__ import annotations

import uuid

import psycopg

from app.core.throwaway import Server as Service
from app.core.throwaway import free_port, postgres_answers, redis_answers, throwaway_postgres, throwaway_redis

REDIS_DEFAULT = "redis://127.0.0.1:6379"
POSTGRES_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"
__all__ = ["Service", "create_database", "drop_database", "free_port", "redis_answers", "start_postgres", "start_redis"]


def start_redis(own: bool = False) -> Service:
    """The machine's Redis when it runs (unless `own`), else a throw-away server of this session."""
    if not own and redis_answers(REDIS_DEFAULT):
        return Service(REDIS_DEFAULT)
    server = throwaway_redis()
    if server.url is None and not own:
        server.reason = f"Redis is not running on 127.0.0.1:6379 and {server.reason}"
    return server


def start_postgres(own: bool = False) -> Service:
    """The machine's PostgreSQL when it runs (unless `own`), else a throw-away server of this session."""
    if not own and postgres_answers(POSTGRES_DEFAULT):
        return Service(POSTGRES_DEFAULT)
    server = throwaway_postgres()
    if server.url is None and not own:
        server.reason = f"PostgreSQL is not running on 127.0.0.1:5432 and {server.reason}"
    return server


def create_database(server_url: str) -> str:
    """A fresh, empty database on the server; returns its SQLAlchemy URL."""
    name = f"pipebd_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    base = server_url.rsplit("/", 1)[0]
    return f"{base.replace('postgresql://', 'postgresql+psycopg://', 1)}/{name}"


def drop_database(server_url: str, database_url: str) -> None:
    name = database_url.rsplit("/", 1)[1]
    with psycopg.connect(server_url, autocommit=True) as connection:
        connection.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
