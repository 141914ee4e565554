"""Database tables (SQLModel) and the shapes the API returns.

Tables: `job` (one row per submitted spec and its lifecycle), `job_metric` (one telemetry line of one
rank), `job_metric_rollup` (runs of consecutive lines merged for charts of long jobs), `job_event`
(what an event stream replays: state changes, metric batches, log lines) and `worker` (each worker's
advertised devices and last heartbeat). Times are Unix seconds in the
database and ISO 8601 (UTC) in the API. The Alembic migrations in migrations/ create the same schema.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, field_serializer
from pydantic import Field as Describe  # plain pydantic fields: the API's answer models below
from sqlalchemy import JSON, Column, Index
from sqlmodel import Field, SQLModel


def now() -> float:
    return time.time()


class Job(SQLModel, table=True):
    # AUTOINCREMENT on SQLite too: an id is never reused after a deletion (PostgreSQL sequences never do)
    __table_args__ = (Index("ix_job_state_id", "state", "id"), {"sqlite_autoincrement": True})

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=100)
    state: str = Field(default="queued", max_length=20)
    nproc: int  # ranks the job needs: it goes to a worker with at least this many devices
    queue: str = Field(max_length=64)
    spec: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    created_at: float = Field(default_factory=now)
    updated_at: float = Field(default_factory=now)
    started_at: float | None = None
    finished_at: float | None = None
    heartbeat_at: float | None = None
    worker: str | None = Field(default=None, max_length=200)
    host: str | None = Field(default=None, max_length=200)
    worker_pid: int | None = None  # the worker process running the job, on `host`
    pid: int | None = None  # the torchrun agent (the profiling one while starting), leader of its own session
    run_dir: str | None = None
    progress: float = 0.0
    samples_per_s: float | None = None
    plan_summary: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    termination_reason: str | None = Field(default=None, max_length=32)
    error: str | None = None
    exit_code: int | None = None
    idempotency_key: str | None = Field(default=None, max_length=200, unique=True)
    request_hash: str | None = Field(default=None, max_length=64)


class JobMetric(SQLModel, table=True):
    __tablename__ = "job_metric"
    __table_args__ = (Index("ix_job_metric_job_rank_seq", "job_id", "rank", "seq"), {"sqlite_autoincrement": True})

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id")
    rank: int
    seq: int  # the rank's task counter (`done`): increases by one per line
    epoch: int
    step: int
    time: float
    record: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))


class JobMetricRollup(SQLModel, table=True):
    """Consecutive telemetry lines of one rank merged into one chart point (see app/rollups.py)."""

    __tablename__ = "job_metric_rollup"
    __table_args__ = (
        Index("ix_job_metric_rollup_job_rank_lines_seq", "job_id", "rank", "lines", "first_seq"),
        {"sqlite_autoincrement": True},
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id")
    rank: int
    lines: int  # telemetry lines merged: 4, 16, 64, ...
    first_seq: int
    last_seq: int
    point: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))  # as app.downsample.merge makes it


class JobEvent(SQLModel, table=True):
    __tablename__ = "job_event"
    __table_args__ = (Index("ix_job_event_job_id_id", "job_id", "id"), {"sqlite_autoincrement": True})

    id: int | None = Field(default=None, primary_key=True)  # the SSE event id
    job_id: int = Field(foreign_key="job.id")
    kind: str = Field(max_length=16)  # state | metrics | log
    data: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    time: float = Field(default_factory=now)


class Worker(SQLModel, table=True):
    name: str = Field(primary_key=True, max_length=200)
    host: str = Field(max_length=200)
    devices: int  # ranks it can run: a job needing N goes only to a worker with N or more
    slots: int  # jobs at once
    queues: str  # comma-separated queue names it consumes
    started_at: float = Field(default_factory=now)
    last_seen: float = Field(default_factory=now)
    running: int = 0


def iso(value: float | None) -> str | None:
    return None if value is None else datetime.fromtimestamp(value, UTC).isoformat().replace("+00:00", "Z")


class JobPublic(BaseModel):
    """A job in lists: its state and progress, never its spec."""

    id: int = Describe(description="The job's id, as in /api/v1/jobs/{id}")
    name: str = Describe(description="The spec's name")
    state: str = Describe(
        description="queued, starting, running, cancelling, succeeded, failed or cancelled (the last three are final)"
    )
    nproc: int = Describe(description="Ranks the job runs on: one per GPU, or CPU processes")
    queue: str = Describe(description="The broker queue it waits in: workers with at least nproc devices read it")
    created_at: float = Describe(description="When it was submitted (ISO 8601, UTC)")
    updated_at: float = Describe(description="Its last state or progress change (ISO 8601, UTC)")
    started_at: float | None = Describe(description="When a worker claimed it (ISO 8601, UTC)")
    finished_at: float | None = Describe(description="When it reached a final state (ISO 8601, UTC)")
    progress: float = Describe(description="Fraction of the training steps done, 0 to 1")
    samples_per_s: float | None = Describe(description="Recent throughput, samples through every block per second")
    termination_reason: str | None = Describe(
        description="Why it ended: user_cancelled, exit_code, rank_error, oom, timeout, worker_lost or launch_error"
    )
    worker: str | None = Describe(description="The worker that runs or ran it")

    @field_serializer("created_at", "updated_at", "started_at", "finished_at")
    def _as_iso(self, value: float | None) -> str | None:
        return iso(value)


class JobDetail(JobPublic):
    """One job: everything in the list entry plus its spec, plan summary, error and why it waits."""

    spec: dict[str, Any] = Describe(description="The spec as stored, with its defaults filled in (see the README)")
    plan_summary: dict[str, Any] | None = Describe(
        description="Mode, stages and predicted step time of the resolved plan; the whole plan is at .../plan"
    )
    error: str | None = Describe(description="The failing rank's traceback, or what else went wrong")
    exit_code: int | None = Describe(description="torchrun's exit code")
    heartbeat_at: float | None = Describe(description="The worker's last heartbeat for this job (ISO 8601, UTC)")
    waiting_reason: str | None = Describe(None, description="For a queued job: what it waits for")

    @field_serializer("heartbeat_at")
    def _heartbeat_iso(self, value: float | None) -> str | None:
        return iso(value)


class JobsPublic(BaseModel):
    """A page of jobs, newest first."""

    data: list[JobPublic] = Describe(description="At most `limit` jobs")
    next_cursor: str | None = Describe(description="Pass as `cursor` for the next (older) page; null on the last page")
