"""Which queued job a free worker takes: the highest priority that fits its devices, the oldest first
within a priority, skipping the children of a sweep that has `max_parallel` of them launched already
(app/core/sweeps.py).

A broker message only wakes a worker (worker/tasks.py): whichever job's id it carries, the worker
claims the job this query names, so priorities hold on every broker (kombu's SQLite transport has no
message priorities) and a requeued job runs on any worker with enough devices. Every queued job has
one message on the broker, and each message starts at most one job, so none is left waiting without
one.
"""

from __future__ import annotations

from sqlmodel import col, select

from app.core.database import session_scope
from app.core.lifecycle import QUEUED
from app.core.sweeps import has_room
from app.core.tables import Job


def next_queued(database: str, devices: int, skip: frozenset[int] = frozenset()) -> int | None:
    """The id of the queued job a worker with `devices` devices should start now (none in `skip`)."""
    query = (
        select(Job.id)
        .where(Job.state == QUEUED, col(Job.nproc) <= devices, col(Job.id).not_in(sorted(skip)), has_room())
        .order_by(col(Job.priority).desc(), col(Job.id))
        .limit(1)
    )
    with session_scope(database) as session:
        return session.exec(query).first()
