"""Service tier: the Alembic migrations build, from an empty database, exactly the schema of the models
(SQLite and PostgreSQL), and downgrade back to empty."""

from __future__ import annotations

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect
from sqlmodel import SQLModel

from app.core import tables  # noqa: F401  (registers the tables on SQLModel.metadata)
from app.core.database import alembic_config, get_engine, migrate


def test_migrations_from_empty_match_the_models(database_url: str) -> None:
    engine = get_engine(database_url)
    assert inspect(engine).get_table_names() == []
    migrate(database_url)
    migrate(database_url)  # a second start-up is a no-op
    assert {"job", "job_metric", "job_event", "worker", "alembic_version"} <= set(inspect(engine).get_table_names())
    with engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), SQLModel.metadata)
    assert differences == []
    command.downgrade(alembic_config(database_url), "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
