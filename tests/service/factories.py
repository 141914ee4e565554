"""Test data: tiny job specs, jobs and telemetry rows in a real database, broker queue inspection."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import redis
from sqlmodel import Session, func, select

from app.core.database import get_engine, migrate
from app.core.figures import store_figures
from app.core.queue import queue_name
from app.core.settings import Settings
from app.core.tables import Job, JobEvent, JobMetric, Sweep
from app.services.jobs import create_job
from app.services.specs import spec_hash
from pipebd_core.documents.summary import Summary
from pipebd_core.documents.telemetry import DistillLine
from pipebd_core.rundir import RunDir
from pipebd_core.spec import parse_spec
from tests.helpers import tiny_document
from tests.telemetry_lines import distill_line


def tiny_job(name: str = "tiny", **sections: dict[str, Any]) -> dict[str, Any]:
    """A 2-rank tiny custom job without profiling: seconds on a CPU."""
    base: dict[str, dict[str, Any]] = {
        "schedule": {"mode": "tr_dpu", "nproc": 2, "profile": False},
        "train": {"epochs": 1},
    }
    for section, values in sections.items():
        base[section] = {**base.get(section, {}), **values}
    return {**tiny_document(**base), "name": name}


def long_job(**sections: dict[str, Any]) -> dict[str, Any]:
    """A tiny job that runs for minutes unless cancelled."""
    sections = {"train": {"epochs": 1000}, "data": {"num_samples": 400}, **sections}
    return tiny_job(**sections)


def queued_job(settings: Settings, document: dict[str, Any] | None = None) -> int:
    """A job stored queued, as the API stores it (the database migrated first); its id."""
    migrate(settings.database)
    spec = parse_spec(document or long_job())
    with Session(get_engine(settings.database), expire_on_commit=False) as session:
        job_id = create_job(session, spec=spec, request_hash=spec_hash(spec), idempotency_key=None).job.id
    assert job_id is not None
    return job_id


def stored(settings: Settings, job_id: int) -> Job:
    """The job's row as the database holds it now."""
    with Session(get_engine(settings.database)) as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job


def count_rows(settings: Settings, table: type[Any]) -> int:
    with Session(get_engine(settings.database)) as session:
        return int(session.exec(select(func.count()).select_from(table)).one())


def broker_messages(settings: Settings, max_ranks: int = 4) -> int:
    """Messages waiting in the broker's job queues (SQLite broker tables or Redis lists)."""
    broker = settings.broker
    if broker.startswith("sqla+sqlite:///"):
        path = Path(broker.removeprefix("sqla+sqlite:///"))
        if not path.exists():
            return 0
        with sqlite3.connect(path) as connection:
            tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if "kombu_message" not in tables:
                return 0
            return int(connection.execute("SELECT count(*) FROM kombu_message WHERE visible = 1").fetchone()[0])
    client = redis.Redis.from_url(broker)
    return sum(int(client.llen(queue_name(n))) for n in range(1, max_ranks + 1))


def insert_job(settings: Settings, state: str = "queued", **fields: Any) -> Job:
    """A job row written straight to the database, for tests of reading paths."""
    document = tiny_job()
    with Session(get_engine(settings.database), expire_on_commit=False) as session:
        job = Job(**{"name": "tiny", "state": state, "nproc": 2, "queue": queue_name(2), "spec": document, **fields})
        session.add(job)
        session.commit()
        return job


def insert_metrics(settings: Settings, job_id: int, rank: int, losses: list[float]) -> None:
    """Telemetry lines as a worker stores them, one per loss value, with a metrics event."""
    with Session(get_engine(settings.database)) as session:
        rows = []
        for seq, loss in enumerate(losses, start=1):
            line = distill_line(
                rank, seq - 1, time=time.time(), loss={0: loss}, samples=10, peak_mem=1000 + seq, total=len(losses)
            )
            rows.append(
                JobMetric(
                    job_id=job_id, rank=rank, seq=seq, epoch=0, step=seq - 1, time=line.time, record=line.to_json()
                )
            )
        session.add_all(rows)
        session.flush()
        job = session.get(Job, job_id)
        if job is not None:
            store_figures(session, job)
        data = {"first_id": rows[0].id, "last_id": rows[-1].id, "progress": 0.5, "samples_per_s": 10.0}
        session.add(JobEvent(job_id=job_id, kind="metrics", data=data))
        session.commit()


def store_lines(settings: Settings, job_id: int, lines: list[DistillLine], event: dict[str, Any] | None = None) -> None:
    """Telemetry lines and the metrics event that carries them to open pages, as the worker stores them;
    `event` adds fields to that event (progress, samples/s)."""
    with Session(get_engine(settings.database)) as session:
        rows = [
            JobMetric(job_id=job_id, rank=r.rank, seq=r.seq, epoch=0, step=r.step, time=r.time, record=r.to_json())
            for r in lines
        ]
        session.add_all(rows)
        session.flush()
        job = session.get(Job, job_id)
        if job is not None:  # the job's figures over its lines, on its row, as the worker stores them
            store_figures(session, job)
        data = {"first_id": rows[0].id, "last_id": rows[-1].id, **(event or {})}
        session.add(JobEvent(job_id=job_id, kind="metrics", data=data))
        session.commit()


def insert_sweep(settings: Settings, overrides: list[dict[str, Any]], **fields: Any) -> tuple[int, list[int]]:
    """A sweep and its queued children written straight to the database (the children's specs are the tiny
    job's, their overrides only recorded), for tests of reading paths; the sweep's id and its children's."""
    migrate(settings.database)
    with Session(get_engine(settings.database), expire_on_commit=False) as session:
        sweep = Sweep(name="tiny-sweep", spec=tiny_job(), search={"list": overrides}, **fields)
        session.add(sweep)
        session.flush()
        assert sweep.id is not None
        sweep_id = sweep.id
        session.commit()
    children = [insert_job(settings, sweep_id=sweep_id, sweep_overrides=item).id for item in overrides]
    return sweep_id, [job_id for job_id in children if job_id is not None]


def write_summary(settings: Settings, job_id: int, summary: Summary) -> None:
    """A finished job's summary.json, as its last phase writes it, in a run directory of its own."""
    folder = settings.runs / f"job-{job_id}"
    folder.mkdir(parents=True)
    RunDir(folder).save_summary(summary)
    with Session(get_engine(settings.database)) as session:
        job = session.get(Job, job_id)
        assert job is not None
        job.run_dir = str(folder)
        session.add(job)
        session.commit()
