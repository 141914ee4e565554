"""The part of sweeps the worker needs (the rest is app/services/sweeps.py): how `max_parallel` holds (and
why a child waits for it), and a sweep's state from its children's.

Every child of a sweep is queued and published like any job. A queued child whose sweep already has
`max_parallel` children launched (starting, running, pausing or cancelling) waits:

- the claim query skips it (`has_room`, used by app/core/priority.py's `next_queued`), so the message that
  woke a worker starts another job, or none;
- the claim itself re-counts under a lock on the sweep's row (`claim_room`): of two workers claiming two
  children of a full sweep at once, the second finds no room and leaves its child queued;
- when a child leaves its worker (the worker's end of a run, the reaper's end of a lost one), `wake` publishes
  the id of the sweep's next queued child, so a waiting child always has a message to start it.

A message that finds nothing to start is dropped (worker/tasks.py), so an extra wake costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from sqlalchemy import or_, update
from sqlmodel import Session, col, func, select

from app.core.database import session_scope
from app.core.states import ACTIVE, CANCELLED, FAILED, PAUSED, QUEUED
from app.core.tables import Job, Sweep, now

Publish = Callable[[int, str], None]  # (job id, queue): put a job's id on the broker


def launched_count(sweep_id: Any) -> Any:
    """A scalar subquery: how many children of `sweep_id` a worker holds now."""
    child = select(Job).subquery()
    return (
        select(func.count())
        .select_from(child)
        .where(child.c.sweep_id == sweep_id, child.c.state.in_(sorted(ACTIVE)))
        .scalar_subquery()
    )


def has_room() -> Any:
    """The condition of a job that no sweep holds back: not a child, or a child of a sweep under its bound."""
    full = select(Sweep.id).where(
        col(Sweep.max_parallel).is_not(None), launched_count(Sweep.id) >= col(Sweep.max_parallel)
    )
    return or_(col(Job.sweep_id).is_(None), col(Job.sweep_id).not_in(full))


def lock_sweep_of(session: Session, job_id: int) -> None:
    """Lock the row of job `job_id`'s sweep (on SQLite: the database) until the caller's transaction ends; a
    job of no sweep locks nothing. Whoever touches a child and its sweep in one transaction (a claim, a child's
    end, a bulk cancel) takes this lock before any child's row, so two of them never wait for each other."""
    sweep_of_job = select(Job.sweep_id).where(Job.id == job_id).scalar_subquery()
    session.execute(update(Sweep).where(col(Sweep.id) == sweep_of_job).values(updated_at=now()))


def claim_room(session: Session, job_id: int) -> bool:
    """Whether the job may be claimed now as far as its sweep goes. Its first statement locks the sweep's row
    (`lock_sweep_of`), so concurrent claims of one sweep's children count one after the other."""
    lock_sweep_of(session, job_id)
    bound = session.exec(select(Job.sweep_id, Sweep.max_parallel).join(Sweep).where(Job.id == job_id)).first()
    if bound is None or bound[1] is None:  # not a child, or a sweep without a bound
        return True
    sweep_id, max_parallel = bound
    return int(session.exec(select(launched_count(sweep_id))).one()) < max_parallel


def held_back(session: Session, job: Job) -> str | None:
    """Why a queued child waits for its sweep (`max_parallel` children launched already), or None."""
    if job.sweep_id is None:
        return None
    sweep = session.get(Sweep, job.sweep_id)
    if sweep is None or sweep.max_parallel is None:
        return None
    launched = int(session.exec(select(launched_count(job.sweep_id))).one())
    if launched < sweep.max_parallel:
        return None
    bound = f"max_parallel {sweep.max_parallel}"
    return f"its sweep {sweep.id} already runs {launched} of its jobs ({bound}); it starts when one ends"


def next_waiting(session: Session, sweep_id: int) -> Job | None:
    """The sweep's queued child that should start first (priority, then age), if any."""
    query = (
        select(Job)
        .where(Job.sweep_id == sweep_id, Job.state == QUEUED)
        .order_by(col(Job.priority).desc(), col(Job.id))
        .limit(1)
    )
    return session.exec(query).first()


def wake(database: str, job_id: int, publish: Publish | None) -> int | None:
    """After child `job_id` left its worker: publish the id of its sweep's next queued child (returned)."""
    if publish is None:
        return None
    with session_scope(database) as session:
        job = session.get(Job, job_id)
        waiting = None if job is None or job.sweep_id is None else next_waiting(session, job.sweep_id)
        target = None if waiting is None else (waiting.id, waiting.queue)
    if target is None or target[0] is None:
        return None
    publish(target[0], target[1])
    return target[0]


SweepState = Literal["queued", "running", "paused", "succeeded", "failed", "cancelled"]


def sweep_state(states: list[str]) -> SweepState:
    """A sweep's state, from its children's:

    every child queued                               -> queued
    a child launched, or queued after others began    -> running
    none queued or launched, one paused              -> paused
    every child ended: one failed                    -> failed
                       else one cancelled            -> cancelled
                       else                          -> succeeded
    """
    if states and all(state == QUEUED for state in states):
        return "queued"
    if any(state == QUEUED or state in ACTIVE for state in states):
        return "running"
    if PAUSED in states:
        return "paused"
    if FAILED in states:
        return "failed"
    return "cancelled" if CANCELLED in states else "succeeded"
