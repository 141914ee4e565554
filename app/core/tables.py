"""Database tables (SQLModel).

Tables: `job` (one row per submitted spec and its lifecycle), `sweep` (a search over a base spec whose
children are ordinary jobs, app/services/sweeps.py), `job_metric` (one telemetry line of one
rank), `job_metric_rollup` (runs of consecutive lines merged for charts of long jobs), `job_event`
(what an event stream replays: state and phase changes, metric batches, log growth), `job_attempt` (each
run of a job: who ran it, how it ended, where its blocks resumed), `worker` (each worker's
advertised devices and last heartbeat), `limit_state` (each admission limit's row, locked while a
submission checks and takes it: app/core/limits.py), `tenant_quota` (a token's fair-share weight and
quotas: app/core/quotas.py), `webhook` (a receiver of chosen events),
`webhook_delivery` (one event on its way to one webhook: app/core/webhooks.py, app/core/deliveries.py),
`gang_seat` (a host's seat in the gang of a job on several nodes: app/core/gangs.py) and `registered_model`
(a model version a job wrote, with its lineage: app/core/registry.py).
Times are Unix seconds in the
database (the API's answer models in app/api/schemas.py show them as ISO 8601, UTC). The Alembic
migrations in migrations/ create the same schema.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from sqlalchemy import JSON, BigInteger, Column, Index
from sqlmodel import Field, SQLModel

from app.core.job_phases import PhaseEntry
from app.core.json_types import JsonObject
from app.core.model_entries import FileEntry, ModelFigures
from app.core.plan_summary import PlanSummary
from pipebd_core.documents.phases import DISTILL

# Ids, steps and ranks are INTEGER columns: 4 bytes on PostgreSQL, so no stored value is larger than this
# (SQLite's are 8 bytes); the API refuses larger numbers in paths, queries and cursors before any query.
DB_INT_MAX = 2**31 - 1


def now() -> float:
    return time.time()


def iso_utc(stamp: float) -> str:
    """A stored time as ISO 8601 in UTC, as the API and webhook payloads show it: `2026-12-02T08:00:00Z`."""
    return datetime.fromtimestamp(stamp, UTC).isoformat().replace("+00:00", "Z")


class Sweep(SQLModel, table=True):
    """A search over a base spec: its children are jobs with `sweep_id` set (app/services/sweeps.py). Its state
    and progress are its children's, read when asked, never stored twice."""

    __table_args__ = ({"sqlite_autoincrement": True},)

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=100)
    spec: JsonObject = Field(sa_column=Column(JSON, nullable=False))  # the base spec document, as sent
    search: JsonObject = Field(sa_column=Column(JSON, nullable=False))  # grid, list or random, as sent
    max_parallel: int | None = None  # children launched at once at most (app/core/sweeps.py); None: no bound
    objective: JsonObject | None = Field(default=None, sa_column=Column(JSON))  # {"metric": ..., "goal": ...}
    best_job_id: int | None = None  # the best child its last `sweep.best_changed` named (app/core/sweep_events.py)
    created_at: float = Field(default_factory=now)
    updated_at: float = Field(default_factory=now)  # also touched by each claim of a child (its row lock)


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
    nproc: int  # ranks the job needs per node: it goes to a worker with at least this many devices
    nodes: int = Field(default=1, sa_column_kwargs={"server_default": "1"})  # >1: a gang of workers on as many hosts
    # an elastic job (schedule.elastic): `nodes` is what its next gang needs; a gang that has `min_nodes` seats
    # at its bound runs with them (app/core/gangs.py), a requeue after a fault asks for its spec's nodes again, and
    # one running on fewer than `max_nodes` may take a larger gang (pipebd_core/job/grow.py)
    min_nodes: int | None = None
    max_nodes: int | None = None
    queue: str = Field(max_length=64)
    spec: JsonObject = Field(sa_column=Column(JSON, nullable=False))
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
    phases: list[PhaseEntry] | None = Field(default=None, sa_column=Column(JSON))  # pipebd_core.job.phases records
    phase_progress: float = Field(default=0.0, sa_column_kwargs={"server_default": "0"})  # of the current phase
    progress: float = 0.0  # of the whole job (pipebd_core.job.phases.job_fraction)
    # the job's figures (app/core/figures.py), stored by the worker with the telemetry lines they come from
    samples_per_s: float | None = None
    busy_share: float | None = None
    peak_mem: int | None = Field(default=None, sa_column=Column(BigInteger))  # bytes
    plan_summary: PlanSummary | None = Field(default=None, sa_column=Column(JSON))  # app/core/plan_summary.py
    termination_reason: str | None = Field(default=None, max_length=32)
    error: str | None = None
    exit_code: int | None = None
    idempotency_key: str | None = Field(default=None, max_length=200, unique=True)
    request_hash: str | None = Field(default=None, max_length=64)
    priority: int = Field(default=0, sa_column_kwargs={"server_default": "0"})  # higher first; FIFO within one
    max_restarts: int | None = None  # automatic restarts after infrastructure faults; None: the server's default
    restarts: int = Field(default=0, sa_column_kwargs={"server_default": "0"})  # automatic restarts used so far
    sweep_id: int | None = Field(default=None, foreign_key="sweep.id", index=True)  # the sweep it is a child of
    sweep_overrides: JsonObject | None = Field(default=None, sa_column=Column(JSON))  # {dotted.path: value}
    tenant: str | None = Field(default=None, max_length=64)  # who submitted it: app.api.auth.tenant_of; None: no tokens

    @property
    def world_size(self) -> int:
        """Its ranks on every node: rank r runs on node r // nproc."""
        return self.nproc * self.nodes


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
    reason: str | None = Field(default=None, max_length=32)  # a termination reason (pipebd_core.job.outcomes)
    resumed_from: list[int] | None = Field(default=None, sa_column=Column(JSON))  # per block: the step it resumed at
    hosts: list[str] | None = Field(default=None, sa_column=Column(JSON))  # each node's host id, node 0 first
    nodes: int | None = None  # the nodes and ranks per node it ran on (an elastic job's may differ between attempts)
    nproc: int | None = None
    plan: str | None = Field(default=None, max_length=200)  # its plan's cut, e.g. "0-6 | 7-12" (plan_summary.cut)


EVAL_SEQ = -1  # the `seq` of a finetune evaluation line (top-1 at an epoch's end): not a step, kept apart


class JobMetric(SQLModel, table=True):
    __tablename__ = "job_metric"
    __table_args__ = (
        Index("ix_job_metric_job_phase_rank_seq", "job_id", "phase", "rank", "seq"),
        {"sqlite_autoincrement": True},
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id")
    phase: str = Field(default=DISTILL, max_length=20, sa_column_kwargs={"server_default": DISTILL})
    rank: int
    seq: int  # the rank's task counter in its phase (done + skipped): one per line; EVAL_SEQ for an evaluation
    epoch: int
    step: int
    time: float
    record: JsonObject = Field(sa_column=Column(JSON, nullable=False))


class JobMetricRollup(SQLModel, table=True):
    """Consecutive telemetry lines of one rank merged into one chart point (see app/core/rollups.py)."""

    __tablename__ = "job_metric_rollup"
    __table_args__ = (
        Index("ix_job_metric_rollup_job_phase_rank_lines_seq", "job_id", "phase", "rank", "lines", "first_seq"),
        {"sqlite_autoincrement": True},
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id")
    phase: str = Field(default=DISTILL, max_length=20, sa_column_kwargs={"server_default": DISTILL})
    rank: int
    lines: int  # telemetry lines merged: 4, 16, 64, ...
    first_seq: int
    last_seq: int
    point: JsonObject = Field(sa_column=Column(JSON, nullable=False))  # as app.core.downsample.merge makes it


class JobEvent(SQLModel, table=True):
    __tablename__ = "job_event"
    __table_args__ = (Index("ix_job_event_job_id_id", "job_id", "id"), {"sqlite_autoincrement": True})

    id: int | None = Field(default=None, primary_key=True)  # the SSE event id
    job_id: int = Field(foreign_key="job.id")
    kind: str = Field(max_length=16)  # state | phase | metrics | log
    data: JsonObject = Field(sa_column=Column(JSON, nullable=False))
    time: float = Field(default_factory=now)


class GangSeat(SQLModel, table=True):
    """One host's seat in the gang of a job on several nodes (app/core/gangs.py): the job starts when it has
    `nodes` seats on as many hosts; an incomplete gang gives all its seats up after its bound."""

    __tablename__ = "gang_seat"
    __table_args__ = (
        Index("ix_gang_seat_job_id_host", "job_id", "host", unique=True),
        Index("ix_gang_seat_job_id_node", "job_id", "node", unique=True),
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id")
    host: str = Field(max_length=200)  # the worker's host id (`pipebd worker --host-id`)
    worker: str = Field(max_length=200)
    node: int  # 0 for the first seat taken: that worker runs the phases and hosts the rendezvous
    joined_at: float = Field(default_factory=now)
    endpoint: str | None = Field(default=None, max_length=300)  # node 0's address for the rendezvous, once known
    leaving_at: float | None = None  # its worker was told to stop (a preemption notice): node 0 checkpoints the job
    heartbeat_at: float | None = None  # the seated worker's last word while its part runs (node 0 watches them)


class Worker(SQLModel, table=True):
    name: str = Field(primary_key=True, max_length=200)
    host: str = Field(max_length=200)
    devices: int  # ranks it can run: a job needing N goes only to a worker with N or more
    slots: int  # jobs at once
    queues: str  # comma-separated queue names it consumes
    started_at: float = Field(default_factory=now)
    last_seen: float = Field(default_factory=now)
    running: int = 0


class LimitState(SQLModel, table=True):
    """One admission limit shared by every API process: the queue's (`queue`, its row only a lock) or one
    client's submission rate (`rate:<client>`, the times of its submissions in the window)."""

    __tablename__ = "limit_state"
    __table_args__ = (Index("ix_limit_state_updated_at", "updated_at"),)

    name: str = Field(primary_key=True, max_length=100)
    times: list[float] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    updated_at: float = Field(default_factory=now)  # the last use: rows of clients quiet for a window are removed


class TenantQuota(SQLModel, table=True):
    """A tenant's (one token's) fair-share weight and quotas (app/core/quotas.py). A tenant without a row has
    weight 1 and no quota. The claim of one of its jobs locks the row (`updated_at`), so two workers count
    its running jobs one after the other."""

    __tablename__ = "tenant_quota"

    tenant: str = Field(primary_key=True, max_length=64)  # the token's fingerprint, as Job.tenant holds it
    name: str = Field(max_length=64, unique=True)  # how reasons and pages name it: alice, team-vision
    weight: float = Field(default=1.0, gt=0)  # its share of the running devices, relative to other tenants'
    max_running: int | None = Field(default=None, ge=0)  # its jobs launched at once at most; more wait queued
    device_hours: float | None = Field(default=None, ge=0)  # ranks x hours per window; past it submissions get 429
    window_h: float = Field(default=24.0, gt=0)  # the rolling window of `device_hours`, in hours
    budget_held: bool = Field(default=False, sa_column_kwargs={"server_default": "0"})  # a claim found it spent
    updated_at: float = Field(default_factory=now)  # also touched by each claim of its jobs (its row lock)


class Webhook(SQLModel, table=True):
    """A receiver of chosen events: every job (`server`), a token's jobs (`token`), one job (`job`) or one sweep
    and its jobs (`sweep`)."""

    id: int | None = Field(default=None, primary_key=True)
    url: str = Field(max_length=2000)
    events: list[str] = Field(sa_column=Column(JSON, nullable=False))  # app.core.webhooks.EVENTS
    scope: str = Field(max_length=16)  # server | token | job | sweep (app.core.webhooks.SCOPES)
    job_id: int | None = None  # scope job: the job (no foreign key: deleting the job deletes its hooks)
    sweep_id: int | None = None  # scope sweep: the sweep (no foreign key, as job_id)
    tenant: str | None = Field(default=None, max_length=64)  # scope token: the token's Job.tenant
    secret: str = Field(max_length=200)  # signs every body (HMAC-SHA256); never shown by the API
    description: str = Field(default="", max_length=200)
    created_at: float = Field(default_factory=now)


class WebhookDelivery(SQLModel, table=True):
    """One event on its way to one webhook: pending until a receiver answers 2xx or the attempts run out."""

    __tablename__ = "webhook_delivery"
    __table_args__ = (
        Index("ix_webhook_delivery_state_next_attempt_at", "state", "next_attempt_at"),
        Index("ix_webhook_delivery_webhook_id_id", "webhook_id", "id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    webhook_id: int = Field(foreign_key="webhook.id")
    event: str = Field(max_length=32)
    job_id: int | None = None  # the job it is about (kept after the job is deleted: the log stays)
    payload: JsonObject = Field(sa_column=Column(JSON, nullable=False))  # pipebd_core.documents.webhook
    state: str = Field(default="pending", max_length=16)  # pending | succeeded | failed
    attempts: int = 0
    next_attempt_at: float | None = Field(default_factory=now)  # due from then (a claimed one: its lease's end)
    last_status: int | None = None  # the receiver's last HTTP status; None: no answer (refused, timed out)
    last_error: str | None = None
    created_at: float = Field(default_factory=now)
    finished_at: float | None = None


class RegisteredModel(SQLModel, table=True):
    """A model version a succeeded job wrote (app/core/registry.py): its files with their sha256, the model it
    was made from, the spec and data it was made with, and its figures. Kept when its job is deleted (its
    files then are gone: the registry says so, and a spec naming it is refused)."""

    __tablename__ = "registered_model"
    __table_args__ = (
        Index("ix_registered_model_job_id_name", "job_id", "name", unique=True),
        Index("ix_registered_model_parent_id", "parent_id"),
        Index("ix_registered_model_kind_id", "kind", "id"),
        {"sqlite_autoincrement": True},
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: int  # the job that wrote it (no foreign key: the registry outlives a deleted job)
    name: str = Field(max_length=64)  # which of the job's models: teacher, distilled, searched, finetuned, choice-<n>
    kind: str = Field(max_length=16)  # teacher | distilled | searched | finetuned | chosen (app.core.registry.KINDS)
    parent_id: int | None = None  # the registered model it was made from
    parent_hash: str | None = Field(default=None, max_length=64)  # the parent's content hash (a teacher by path too)
    content_hash: str = Field(max_length=64)  # sha256 over its files' names and sha256s
    spec_hash: str | None = Field(default=None, max_length=64)  # the job's spec (app.services.specs.spec_hash)
    data_fingerprint: str | None = Field(default=None, max_length=64)  # the data section and a data folder's files
    run_dir: str  # where its files are: `files` paths are relative to it
    files: list[FileEntry] = Field(sa_column=Column(JSON, nullable=False))  # {path, size, sha256}
    metrics: ModelFigures = Field(sa_column=Column(JSON, nullable=False))  # the figures its job measured
    mlflow_version: str | None = Field(default=None, max_length=300)  # `name/version` in MLflow's registry, once there
    created_at: float = Field(default_factory=now)
