"""Alembic environment: migrates the database named by the app's settings (or the URL it is given).

On PostgreSQL the migration holds an advisory lock, so an API and workers starting together never
run the same migration twice.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import text
from sqlmodel import SQLModel

from app.core import tables  # noqa: F401  (registers the tables on SQLModel.metadata)
from app.core.database import get_engine
from app.core.settings import get_settings

MIGRATION_LOCK_ID = 7_421_003  # an arbitrary constant shared by every PipeBD process

config = context.config
target_metadata = SQLModel.metadata


def database_url() -> str:
    return config.get_main_option("sqlalchemy.url") or get_settings().database


def run_migrations_offline() -> None:
    context.configure(url=database_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = get_engine(database_url())
    with engine.connect() as connection:
        postgres = connection.dialect.name == "postgresql"
        if postgres:
            connection.execute(text("SELECT pg_advisory_lock(:id)"), {"id": MIGRATION_LOCK_ID})
            connection.commit()
        try:
            context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
            with context.begin_transaction():
                context.run_migrations()
        finally:
            if postgres:
                connection.execute(text("SELECT pg_advisory_unlock(:id)"), {"id": MIGRATION_LOCK_ID})
                connection.commit()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
