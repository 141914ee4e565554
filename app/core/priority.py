"""Which queued job a free worker takes: among the queued jobs that fit its devices, that no sweep holds
back (`max_parallel`, app/core/sweeps.py) and whose tenant's quota lets start (app/core/quotas.py), the
next in the weighted fair-share order (app/core/fairshare.py): the tenant using least per unit of weight
first, by priority then age within a tenant (with one tenant: the highest priority, the oldest first).

A broker message only wakes a worker (worker/tasks.py): whichever job's id it carries, the worker
claims the job this query names, so priorities hold on every broker (kombu's SQLite transport has no
message priorities) and a requeued job runs on any worker with enough devices. Every queued job has
one message on the broker, and each message starts at most one job; a message that finds nothing to
start is dropped, so a job held back by its sweep or its tenant's quota is published again when what
held it ends (`wake_held`, and app/core/quotas.py `release_budgets` for a device-hour budget).

A broker that lost its messages (Redis restarted without persistence) would leave queued jobs asleep beside idle
workers: the API publishes again every job queued for `rewake_after_s` while a live worker has room and devices
for it (`rewake_stranded`, at most once per `rewake_after_s` a job); an extra wake starts nothing.
"""

from __future__ import annotations

from sqlalchemy import or_
from sqlmodel import col, select

from app.core.database import session_scope
from app.core.fairshare import claim_order, queued, shares
from app.core.quotas import Publish, held_at_claim, next_of_tenant, quotas
from app.core.states import QUEUED
from app.core.sweeps import has_room, wake
from app.core.tables import Job, Worker, now


def next_queued(database: str, devices: int, skip: frozenset[int] = frozenset()) -> int | None:
    """The id of the queued job a worker with `devices` devices should start now (none in `skip`)."""
    with session_scope(database) as session:
        held = held_at_claim(session, now())
        waiting = queued(
            session,
            col(Job.nproc) <= devices,
            col(Job.id).not_in(sorted(skip)),
            has_room(),
            or_(col(Job.tenant).is_(None), col(Job.tenant).not_in(held)),
        )
        first = claim_order(waiting, shares(session), limit=1)
    return first[0].id if first else None


def wake_tenant(database: str, job_id: int, publish: Publish | None) -> int | None:
    """After job `job_id` left its worker: publish the id of its tenant's next queued job (returned), when the
    tenant has a quota that may have held it back."""
    if publish is None:
        return None
    with session_scope(database) as session:
        job = session.get(Job, job_id)
        if job is None or job.tenant is None or job.tenant not in quotas(session):
            return None
        waiting = next_of_tenant(session, job.tenant)
        target = None if waiting is None or waiting.id is None else (waiting.id, waiting.queue)
    if target is None:
        return None
    publish(*target)
    return target[0]


def wake_held(database: str, job_id: int, publish: Publish | None) -> None:
    """After job `job_id` left its worker: wake what it may have held back, its sweep's next child and its
    tenant's next job (an extra wake starts nothing)."""
    wake(database, job_id, publish)
    wake_tenant(database, job_id, publish)


def rewake_stranded(
    database: str, publish: Publish, after_s: float, alive_s: float, woken: dict[int, float]
) -> list[int]:
    """Publish every job queued for `after_s` or more while a worker heard from within `alive_s` has a free slot
    and enough devices for it, unless `woken` (job -> when, kept by the caller) says it was woken within
    `after_s`; returns their ids."""
    stamp = now()
    with session_scope(database) as session:
        workers = session.exec(select(Worker).where(col(Worker.last_seen) >= stamp - alive_s)).all()
        room = max((w.devices for w in workers if w.running < w.slots), default=0)
        query = select(Job.id, Job.queue).where(Job.state == QUEUED, col(Job.updated_at) <= stamp - after_s)
        waiting = session.exec(query.where(col(Job.nproc) <= room)).all()
    stranded = [
        (job_id, queue) for job_id, queue in waiting if job_id is not None and woken.get(job_id, 0.0) <= stamp - after_s
    ]
    for job_id, queue in stranded:
        publish(job_id, queue)
        woken[job_id] = stamp
    for job_id in set(woken) - {job_id for job_id, _ in waiting}:
        del woken[job_id]  # started or left the queue
    return [job_id for job_id, _ in stranded]
