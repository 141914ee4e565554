"""Service tier: the Alembic migrations build, from an empty database, exactly the schema of the models
(SQLite and PostgreSQL), and downgrade back to empty."""

from __future__ import annotations

import json
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlmodel import Session, SQLModel

from app.core import tables
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


JOB_0005 = ("name", "state", "nproc", "queue", "created_at", "updated_at", "progress")  # columns without defaults


def test_telemetry_stored_before_documents_were_versioned_reads_after_the_upgrade(database_url: str) -> None:
    """A line stored by revision 0005 (no format_version) is stamped by 0006 and reads as a DistillLine; the
    downgrade takes the stamp off again."""
    from pipebd_core.documents.telemetry import read_line

    engine = get_engine(database_url)
    config = alembic_config(database_url)
    command.upgrade(config, "0005")
    old = {"time": 1.0, "rank": 0, "epoch": 0, "step": 0, "round": "weights", "blocks": [0], "loss": {"0": 0.5}}
    old |= {"phases": {}, "block_s": {"teacher": {"0": 0.1}, "student": {"0": 0.2}}, "samples": 4}
    old |= {"peak_mem": 1, "cur_mem": 1, "done": 1, "total": 1}
    job_0005 = sa.table("job", *(sa.column(name) for name in JOB_0005), sa.column("spec", sa.JSON()))
    with engine.begin() as connection:  # the job as revision 0005 has it (later revisions add columns)
        row = {"name": "old", "state": "succeeded", "nproc": 1, "queue": "pipebd", "spec": {}}
        connection.execute(sa.insert(job_0005).values(**row, created_at=1.0, updated_at=1.0, progress=0.0))
        job_id = connection.execute(text("SELECT max(id) FROM job")).scalar_one()
    with Session(engine) as session:  # job_metric is as revision 0005 has it
        session.add(tables.JobMetric(job_id=job_id, rank=0, seq=1, epoch=0, step=0, time=1.0, record=old))
        session.commit()
    command.upgrade(config, "0006")
    with engine.connect() as connection:
        (stored,) = connection.execute(text("SELECT record FROM job_metric")).scalars().all()
    stored = stored if isinstance(stored, dict) else json.loads(stored)
    assert read_line("distill", json.dumps(stored)).loss == {0: 0.5}
    command.downgrade(config, "0005")
    with engine.connect() as connection:
        (stored,) = connection.execute(text("SELECT record FROM job_metric")).scalars().all()
    assert "format_version" not in (stored if isinstance(stored, dict) else json.loads(stored))
    command.downgrade(config, "base")


def test_adding_sweeps_never_reuses_a_deleted_jobs_id(tmp_path: Path) -> None:
    """On SQLite, 0007 copies the job table to add its foreign key: the copy still never gives an id again."""
    url = f"sqlite:///{tmp_path / 'ids.db'}"
    command.upgrade(alembic_config(url), "0006")
    job_0006 = sa.table("job", *(sa.column(name) for name in JOB_0005), sa.column("spec", sa.JSON()))
    row = {"state": "succeeded", "nproc": 1, "queue": "pipebd", "spec": {}, "created_at": 1.0, "updated_at": 1.0}
    with get_engine(url).begin() as connection:
        for name in ("kept", "deleted"):
            connection.execute(sa.insert(job_0006).values(name=name, progress=0.0, **row))
        connection.execute(text("DELETE FROM job WHERE name = 'deleted'"))
    migrate(url)
    with Session(get_engine(url)) as session:
        job = tables.Job(name="new", nproc=1, queue="pipebd", spec={})
        session.add(job)
        session.commit()
        assert job.id == 3
