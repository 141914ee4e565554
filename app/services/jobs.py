"""Reading and writing jobs: creation with idempotency keys, cursor pages, deletion, why a job waits and its
place in the queue.

Keyword-only functions taking a session; the routes stay thin and the worker reuses none of this.
"""

from __future__ import annotations

import base64
import binascii
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import delete, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, func, select

from app.core import gangs
from app.core.fairshare import Share, Waiting, claim_order, queued, shares
from app.core.limits import QUEUE, hold
from app.core.queue import queue_name
from app.core.quotas import held_tenants, label, quotas
from app.core.states import AT_REST, CANCELLED, FAILED, PAUSED, QUEUED
from app.core.sweeps import held_back
from app.core.tables import DB_INT_MAX, GangSeat, Job, JobAttempt, JobEvent, JobMetric, JobMetricRollup, Worker
from app.core.webhooks import forget_job, notify_state
from app.services.errors import EXCERPT_CHARS, excerpt
from pipebd_core.spec import Spec


class ConflictError(ValueError):
    """The request contradicts the job's state or an earlier request (status 409 or 422)."""


class QueueFull(Exception):
    """The queue holds `queued` jobs, its capacity or more: the submission is refused (429)."""

    def __init__(self, queued: int) -> None:
        super().__init__(queued)
        self.queued = queued


@dataclass
class Created:
    job: Job
    replayed: bool  # True: an earlier request with the same Idempotency-Key created it


def new_job(spec: Spec, **fields: Any) -> Job:
    """The queued job row of a spec (not yet added to a session); `fields` sets the others (a sweep's, a key)."""
    return Job(
        name=spec.name,
        nproc=spec.schedule.nproc,
        nodes=spec.schedule.nodes,
        min_nodes=None if spec.schedule.elastic is None else spec.schedule.elastic.min_nodes,
        max_nodes=None if spec.schedule.elastic is None else spec.schedule.elastic.max_nodes or spec.schedule.nodes,
        queue=queue_name(spec.schedule.nproc),
        spec=spec.model_dump(mode="json"),
        priority=spec.priority,
        max_restarts=spec.max_restarts,
        **fields,
    )


def queued_event(job_id: int) -> JobEvent:
    """The first `state` event of a job just stored."""
    return JobEvent(job_id=job_id, kind="state", data={"state": QUEUED, "termination_reason": None})


def take_queue_room(session: Session, max_queued: int, adding: int = 1) -> None:
    """Hold the queue's lock (app/core/limits.py) until this session commits, and raise QueueFull unless
    `adding` more queued jobs (a sweep's children) stay within `max_queued`."""
    hold(session, QUEUE, time.time())
    if (queued := queued_count(session)) + adding > max_queued:
        session.rollback()
        raise QueueFull(queued)


def create_job(
    session: Session,
    *,
    spec: Spec,
    request_hash: str,
    idempotency_key: str | None,
    max_queued: int | None = None,
    tenant: str | None = None,
) -> Created:
    """Store a queued job (submitted by `tenant`, app.api.auth.tenant_of), with its `job.queued` webhook
    deliveries, or return the job an identical earlier request with the same key created.

    With `max_queued`, the queue's lock is held from the count of queued jobs to the commit of this one,
    and QueueFull is raised when `max_queued` are already queued."""
    if max_queued is not None:
        hold(session, QUEUE, time.time())
    if idempotency_key is not None:
        existing = replayed(session, idempotency_key, request_hash)
        if existing is not None:
            return Created(existing, replayed=True)
    if max_queued is not None:
        take_queue_room(session, max_queued)
    job = new_job(spec, idempotency_key=idempotency_key, request_hash=request_hash, tenant=tenant)
    session.add(job)
    try:
        session.flush()
    except IntegrityError:  # another request with the same key won the race
        session.rollback()
        existing = replayed(session, idempotency_key or "", request_hash)
        if existing is None:
            raise
        return Created(existing, replayed=True)
    assert job.id is not None
    session.add(queued_event(job.id))
    notify_state(session, job.id, job.created_at)
    session.commit()
    session.refresh(job)
    return Created(job, replayed=False)


def replayed(session: Session, key: str, request_hash: str) -> Job | None:
    """The job an earlier request with this Idempotency-Key created (ConflictError if for another spec)."""
    job = session.exec(select(Job).where(Job.idempotency_key == key)).first()
    if job is not None and job.request_hash != request_hash:
        raise ConflictError(
            f"Idempotency-Key {key!r} was already used for job {job.id} with a different spec;"
            " send the same spec to get that job back, or use a new key for a new job"
        )
    return job


CURSOR_MAX = 64  # characters of a cursor at most (this API's are about 20)


def encode_cursor(row_id: int, kind: str = "job") -> str:
    """The cursor of a page that ends at row `row_id` of a list of `kind` (jobs, webhook deliveries)."""
    return base64.urlsafe_b64encode(f"{kind}:{row_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str, kind: str = "job") -> int:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        prefix, _, value = text.partition(":")
        if prefix != kind or not value.isdigit() or int(value) > DB_INT_MAX:
            raise ValueError(prefix)
        return int(value)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        shown = excerpt(repr(cursor), EXCERPT_CHARS)
        raise ValueError(f"cursor {shown} was not returned by this API; pass a next_cursor value or none") from None


def list_jobs(session: Session, *, state: str | None, limit: int, cursor: str | None) -> tuple[list[Job], str | None]:
    """Newest first, `limit` at a time; the cursor is the id of the last job of the previous page."""
    query = select(Job).order_by(col(Job.id).desc()).limit(limit + 1)
    if state is not None:
        query = query.where(Job.state == state)
    if cursor is not None:
        query = query.where(col(Job.id) < decode_cursor(cursor))
    jobs = list(session.exec(query).all())
    more = len(jobs) > limit
    jobs = jobs[:limit]
    return jobs, (encode_cursor(jobs[-1].id) if more and jobs[-1].id is not None else None)


def queued_count(session: Session) -> int:
    return int(session.exec(select(func.count()).select_from(Job).where(Job.state == QUEUED)).one())


def delete_job(session: Session, *, job: Job) -> None:
    """Remove a finished job, its metrics (and their rollups), its events, its own webhooks and its run
    directory (deliveries about it to other hooks stay in their logs, and pending ones are still sent)."""
    if job.state not in AT_REST:
        raise ConflictError(f"job {job.id} is {job.state}; cancel it and wait for it to end before deleting it")
    assert job.id is not None
    for table in (JobMetric, JobMetricRollup, JobEvent, JobAttempt, GangSeat):
        session.execute(delete(table).where(col(table.job_id) == job.id))
    forget_job(session, job.id, unsent=False)
    session.delete(job)
    session.commit()
    if job.run_dir:
        shutil.rmtree(Path(job.run_dir), ignore_errors=True)


def queue_order(session: Session) -> list[Waiting]:
    """Every queued job, in the order they start if none ends meanwhile (app/core/fairshare.py): the jobs of
    tenants their quota holds come last, in their own order."""
    held = held_tenants(session, time.time())
    waiting = queued(session)
    current = shares(session)
    free = claim_order([job for job in waiting if job.tenant not in held], current)
    return free + claim_order([job for job in waiting if job.tenant in held], current)


def queue_position(session: Session, *, job: Job) -> int | None:
    """For a queued job: how many queued jobs start before it."""
    if job.state != QUEUED:
        return None
    order = [waiting.id for waiting in queue_order(session)]
    return order.index(job.id) if job.id in order else None


REPRIORITIZABLE = (QUEUED, PAUSED, FAILED, CANCELLED)  # waiting, or may wait again once resumed


def change_priority(session: Session, *, job: Job, priority: int) -> None:
    """Set a job's priority for its next claim: a queued job moves in the queue at once; a paused, failed or
    cancelled one waits at it once resumed. A job that has started (or ended well) keeps its own: ConflictError.
    One conditional UPDATE, so a worker claiming the job meanwhile wins cleanly."""
    changed = session.exec(
        update(Job).where(col(Job.id) == job.id, col(Job.state).in_(REPRIORITIZABLE)).values(priority=priority)
    )
    session.commit()
    if changed.rowcount == 0:
        session.refresh(job)
        raise ConflictError(
            f"the job is {job.state}: only a queued job, or a paused, failed or cancelled one (for when it is"
            " resumed), takes a new priority"
        )


def ordinal(number: int) -> str:
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def order_reason(session: Session, *, job: Job, ahead: int) -> str:
    """Why `ahead` queued jobs start before `job`: priority and age, or with several tenants, each one's use
    against its weight (the fair-share rule, app/core/fairshare.py)."""
    jobs = f"{ahead} queued job{'s' if ahead > 1 else ''}"
    tenants = set(session.exec(select(Job.tenant).where(Job.state == QUEUED).distinct()).all())
    current, named = shares(session), quotas(session)
    if len(tenants | {tenant for tenant, share in current.items() if share.devices}) <= 1:
        return f"{jobs} with a higher priority or submitted earlier run first"
    uses = []
    for tenant in sorted(tenants, key=lambda t: (t != job.tenant, label(t, named.get(t or "")))):
        share = current.get(tenant, Share())
        uses.append(
            f"tenant {label(tenant, named.get(tenant or ''))} uses {share.devices} running"
            f" device{'s' if share.devices != 1 else ''} at weight {share.weight:g} ({share.use:.2f} per unit)"
        )
    start = "starts" if ahead == 1 else "start"
    return (
        f"{ordinal(ahead + 1)} in line, {jobs} {start} first under fair share: {'; '.join(uses)}; a free worker"
        " takes the next job of the tenant using least per unit of weight, by priority then age within a tenant"
    )


def waiting_reason(session: Session, *, job: Job, stale_after_s: float) -> str | None:
    """For a queued job: why no worker has started it yet."""
    if job.state != QUEUED:
        return None
    sweep = held_back(session, job)
    if sweep is not None:
        return sweep
    quota = held_tenants(session, time.time()).get(job.tenant or "")
    if quota is not None:
        return quota
    ahead = queue_position(session, job=job) or 0
    waits = waiting_for(session, job=job, stale_after_s=stale_after_s)
    if ahead == 0:
        return waits
    return f"{order_reason(session, job=job, ahead=ahead)}; {waits}"


def waiting_for(session: Session, *, job: Job, stale_after_s: float) -> str:
    """What a queued job at the head of the queue waits for."""
    gang = gangs.waiting_for(session, job)  # a job on several nodes: the hosts of its gang
    if gang is not None:
        return gang
    cutoff = time.time() - stale_after_s
    workers = list(session.exec(select(Worker).where(Worker.last_seen >= cutoff)).all())
    if not workers:
        return "no worker is connected; start one with `pipebd worker` (or use `pipebd up`)"
    largest = max(worker.devices for worker in workers)
    if largest < job.nproc:
        return f"the job needs {job.nproc} devices but the largest connected worker has {largest}"
    return "waiting for a free worker slot" if all(w.running >= w.slots for w in workers) else "waiting for a worker"


def discard_jobs(session: Session, *, job_ids: list[int]) -> None:
    """Undo a creation whose enqueue failed: the jobs never existed (nor did their `job.queued` deliveries;
    the caller commits)."""
    session.rollback()
    for job_id in job_ids:
        forget_job(session, job_id, unsent=True)
    session.execute(delete(JobEvent).where(col(JobEvent.job_id).in_(job_ids)))
    session.execute(delete(JobAttempt).where(col(JobAttempt.job_id).in_(job_ids)))
    session.execute(delete(GangSeat).where(col(GangSeat.job_id).in_(job_ids)))
    session.execute(delete(Job).where(col(Job.id).in_(job_ids)))
