"""Database engines, sessions and migrations.

SQLite (the embedded default) runs in WAL mode with a busy timeout, so the API reads while a worker
writes. `migrate` applies the Alembic migrations in migrations/ up to head; the API, the workers and
`pipebd up` call it at start-up, so a fresh data folder or an empty PostgreSQL database just works.

`DATABASE_DOWN` are the errors that mean the database does not answer (a restart, a network cut): the
API answers them with 503, and a worker keeps its ranks running through them (`persist` retries what
must be written).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, event, text
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
from sqlmodel import Session, create_engine

MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"
SQLITE_BUSY_TIMEOUT_S = 30  # a writer waits this long for another writer instead of failing
DATABASE_DOWN = (OperationalError, InterfaceError, DisconnectionError)  # the database does not answer
RETRY_S = 1.0  # `persist` tries again this often
T = TypeVar("T")
log = logging.getLogger("pipebd.database")


def _sqlite_pragmas(connection: Any, _record: Any) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_S * 1000}")
    cursor.close()


@functools.lru_cache(maxsize=16)
def get_engine(url: str) -> Engine:
    """One engine per database URL and process (engines hold the connection pool)."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def write_lock(session: Session, table: type[T], key: Any) -> T | None:
    """Row `key` of `table` (a SQLModel class), read fresh and held locked until `session`'s transaction ends,
    so a check of it and the writes that follow see no other writer's commit in between; None when there is
    no such row. PostgreSQL locks the row (`SELECT ... FOR UPDATE`); SQLite has no row locks and its driver
    starts no transaction on a read, so a no-op write takes the database's write lock there first (other
    writers wait, up to the busy timeout)."""
    if session.get_bind().dialect.name != "sqlite":
        return session.get(table, key, with_for_update=True, populate_existing=True)
    primary = table.__table__.c.id  # type: ignore[attr-defined]
    session.execute(primary.table.update().where(primary == key).values(id=primary))
    return session.get(table, key, populate_existing=True)


@contextmanager
def session_scope(url: str) -> Iterator[Session]:
    """A session for background code (workers, the reaper): commits on success, rolls back on error."""
    with Session(get_engine(url), expire_on_commit=False) as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def migrate(url: str) -> None:
    """Bring the database at `url` to the newest schema (a no-op when it is already there)."""
    command.upgrade(alembic_config(url), "head")


def ping(url: str) -> None:
    """Raise if the database cannot answer a trivial query."""
    with get_engine(url).connect() as connection:
        connection.execute(text("SELECT 1"))


def persist(write: Callable[[], T], patience_s: float, what: str) -> T:
    """`write()`, tried again every RETRY_S while the database does not answer, for up to `patience_s`."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return write()
        except DATABASE_DOWN as error:
            if time.monotonic() > deadline:
                raise
            log.warning("%s: the database does not answer (%s); retrying", what, type(error).__name__)
            time.sleep(RETRY_S)
