"""Database tables (SQLModel).

Tables: `job` (one row per submitted spec and its lifecycle), `job_metric` (one telemetry line of one
rank), `job_metric_rollup` (runs of consecutive lines merged for charts of long jobs), `job_event`
(what an event stream replays: state and phase changes, metric batches, log growth), `job_attempt` (each
run of a job: who ran it, how it ended, where its blocks resumed) and `worker` (each worker's
advertised devices and last heartbeat). Times are Unix seconds in the
database (the API's answer models in app/api/schemas.py show them as ISO 8601, UTC). The Alembic
migrations in migrations/ create the same schema.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import JSON, Column, Index
from sqlmodel import Field, SQLModel

# Ids, steps and ranks are INTEGER columns: 4 bytes on PostgreSQL, so no stored value is larger than this
# (SQLite's are 8 bytes); the API refuses larger numbers in paths, queries and cursors before any query.
DB_INT_MAX = 2**31 - 1


def now() -> float:
    return time.time()


class Job(SQLModel, table=True):
    # AUTOINCREMENT on SQLite too: an id is never reused after a deletion (PostgreSQL sequences never do)
    __table_args__ = (
        Index("ix_job_state_id", "state", "id"),
        Index("ix_job_state_priority_id", "state", "priority", "id"),
        {"sqlite_autoincrement": True},
    )

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
    phase: str | None = Field(default=None, max_length=20)  # the phase running now, else the one that ran last
    phases: list[dict[str, Any]] | None = Field(default=None, sa_column=Column(JSON))  # pipebd_core.phases records
    phase_progress: float = Field(default=0.0, sa_column_kwargs={"server_default": "0"})  # of the current phase
    progress: float = 0.0  # of the whole job (pipebd_core.phases.job_fraction)
    samples_per_s: float | None = None
    plan_summary: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    termination_reason: str | None = Field(default=None, max_length=32)
    error: str | None = None
    exit_code: int | None = None
    idempotency_key: str | None = Field(default=None, max_length=200, unique=True)
    request_hash: str | None = Field(default=None, max_length=64)
    priority: int = Field(default=0, sa_column_kwargs={"server_default": "0"})  # higher first; FIFO within one
    max_restarts: int | None = None  # automatic restarts after infrastructure faults; None: the server's default
    restarts: int = Field(default=0, sa_column_kwargs={"server_default": "0"})  # automatic restarts used so far


class JobAttempt(SQLModel, table=True):
    """One run of a job, from a worker's claim to the job leaving that worker (app/core/attempts.py)."""

    __tablename__ = "job_attempt"
    __table_args__ = (Index("ix_job_attempt_job_id_number", "job_id", "number", unique=True),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id")
    number: int  # 1, 2, ... per job
    worker: str | None = Field(default=None, max_length=200)
    started_at: float = Field(default_factory=now)
    ended_at: float | None = None
    outcome: str | None = Field(default=None, max_length=20)  # the state the job left this attempt for
    reason: str | None = Field(default=None, max_length=32)  # a termination reason (pipebd_core.outcomes)
    resumed_from: list[int] | None = Field(default=None, sa_column=Column(JSON))  # per block: the step it resumed at


EVAL_SEQ = -1  # the `seq` of a finetune evaluation line (top-1 at an epoch's end): not a step, kept apart


class JobMetric(SQLModel, table=True):
    __tablename__ = "job_metric"
    __table_args__ = (
        Index("ix_job_metric_job_phase_rank_seq", "job_id", "phase", "rank", "seq"),
        {"sqlite_autoincrement": True},
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id")
    phase: str = Field(default="distill", max_length=20, sa_column_kwargs={"server_default": "distill"})
    rank: int
    seq: int  # the rank's task counter in its phase (done + skipped): one per line; EVAL_SEQ for an evaluation
    epoch: int
    step: int
    time: float
    record: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))


class JobMetricRollup(SQLModel, table=True):
    """Consecutive telemetry lines of one rank merged into one chart point (see app/core/rollups.py)."""

    __tablename__ = "job_metric_rollup"
    __table_args__ = (
        Index("ix_job_metric_rollup_job_phase_rank_lines_seq", "job_id", "phase", "rank", "lines", "first_seq"),
        {"sqlite_autoincrement": True},
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id")
    phase: str = Field(default="distill", max_length=20, sa_column_kwargs={"server_default": "distill"})
    rank: int
    lines: int  # telemetry lines merged: 4, 16, 64, ...
    first_seq: int
    last_seq: int
    point: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))  # as app.core.downsample.merge makes it


class JobEvent(SQLModel, table=True):
    __tablename__ = "job_event"
    __table_args__ = (Index("ix_job_event_job_id_id", "job_id", "id"), {"sqlite_autoincrement": True})

    id: int | None = Field(default=None, primary_key=True)  # the SSE event id
    job_id: int = Field(foreign_key="job.id")
    kind: str = Field(max_length=16)  # state | phase | metrics | log
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
