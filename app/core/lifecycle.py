"""The job lifecycle: the table of allowed moves between the states (app/core/states.py), and the one
function that changes a state.

    queued -> starting -> running -> succeeded | failed | cancelled
                 \\           \\-> cancelling -> cancelled (| failed | succeeded, if it ended first)
                  \\           \\-> pausing -> paused (| succeeded | failed, if it ended first; | cancelling)
                   \\-> cancelling, pausing, failed, cancelled;   queued -> cancelled | failed | paused
    starting | running | pausing -> queued       requeued: an infrastructure fault or the worker shut down
    failed | cancelled | paused -> queued         resumed by a user (POST .../resume)
    paused -> cancelled

How a launched job's run ended (its processes gone) is recorded by `settle`, the one decision the worker
(at the end of a run) and the reaper (for a job whose worker died) both make, restart budget included.

Every change goes through `transition`, a compare-and-set `UPDATE ... WHERE state IN (...)`: of two
workers claiming the same job only one wins, and of a pause, a cancel and a job finishing only the
first move from a given state wins. Each change also appends a `state` event for the job's event
stream, keeps the job's attempts (app/core/attempts.py) in step, and enqueues the `job.<state>` webhook
deliveries (app/core/webhooks.py) and a sweep child's end's sweep events (app/core/sweep_events.py), in the
same transaction: a claim opens an attempt, any move off the
worker closes it, and a move is notified exactly when it happened.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypedDict, Unpack

from sqlalchemy import update
from sqlmodel import Session

from app.core.attempts import GROWN, close_attempt, closing_outcome, open_attempt
from app.core.gangs import wanted_nodes
from app.core.states import (
    ACTIVE,
    CANCELLED,
    CANCELLING,
    FAILED,
    FINAL,
    PAUSED,
    PAUSING,
    QUEUED,
    RUNNING,
    STARTING,
    SUCCEEDED,
)
from app.core.sweep_events import notify_sweep
from app.core.sweeps import lock_sweep_of
from app.core.tables import Job, JobEvent, now
from app.core.webhooks import notify_state
from pipebd_core.job.outcomes import TERMINATION_REASONS, Result, Termination

ALLOWED_MOVES: dict[str, frozenset[str]] = {
    QUEUED: frozenset({STARTING, CANCELLED, FAILED, PAUSED}),
    STARTING: frozenset({RUNNING, CANCELLING, PAUSING, CANCELLED, FAILED, PAUSED, QUEUED}),
    RUNNING: frozenset({SUCCEEDED, FAILED, CANCELLING, PAUSING, QUEUED}),
    PAUSING: frozenset({PAUSED, SUCCEEDED, FAILED, CANCELLING, QUEUED}),
    PAUSED: frozenset({QUEUED, CANCELLED}),
    CANCELLING: frozenset({CANCELLED, FAILED, SUCCEEDED}),
    SUCCEEDED: frozenset(),
    FAILED: frozenset({QUEUED}),
    CANCELLED: frozenset({QUEUED}),
}


class TransitionError(ValueError):
    """A move the lifecycle table forbids: a bug in the caller, not a race."""


def check_move(source: str, target: str) -> None:
    if target not in ALLOWED_MOVES.get(source, frozenset()):
        allowed = ", ".join(sorted(ALLOWED_MOVES.get(source, ()))) or "nothing (final state)"
        raise TransitionError(
            f"a job cannot move from {source!r} to {target!r}; from {source!r} it may move to {allowed}"
        )


class JobChanges(TypedDict, total=False):
    """The columns of a job that a move sets besides its state (`transition`'s keyword arguments)."""

    termination_reason: str | None
    error: str | None
    exit_code: int | None
    finished_at: float | None
    pid: int | None
    heartbeat_at: float | None
    restarts: int
    progress: float
    phase_progress: float
    worker: str | None
    host: str | None
    worker_pid: int | None
    started_at: float | None
    run_dir: str | None
    nodes: int


class JobMove(JobChanges, total=False):
    """Everything a move writes: the state, when, and the changes."""

    state: str
    updated_at: float


def transition(
    session: Session,
    job_id: int,
    target: str,
    expected: Iterable[str],
    *,
    note: str | None = None,
    **fields: Unpack[JobChanges],
) -> bool:
    """Move job `job_id` from one of `expected` to `target`, setting `fields`; False if it was in no such state.

    The caller commits. A final target also sets `finished_at`. `note` is the reason recorded on the
    attempt a move off the worker closes (default: the termination_reason).
    """
    sources = sorted(set(expected))
    for source in sources:
        check_move(source, target)
    for reason in (fields.get("termination_reason"), note):
        if reason not in (None, *TERMINATION_REASONS):  # the table: pipebd_core.job.outcomes
            raise TransitionError(f"unknown termination_reason {reason!r}")
    stamp = now()
    values: JobMove = {"state": target, "updated_at": stamp, **fields}
    if target in FINAL:
        values.setdefault("finished_at", stamp)
    if target in FINAL:  # a child's end decides its sweep's events: its sweep's row first (app/core/sweep_events.py)
        lock_sweep_of(session, job_id)
    statement = update(Job).where(Job.id == job_id, Job.state.in_(sources)).values(**values)  # type: ignore[attr-defined,arg-type]
    if session.execute(statement).rowcount != 1:  # type: ignore[attr-defined]
        return False
    if target == STARTING:
        open_attempt(session, job_id, fields.get("worker"), fields.get("host"), stamp)
    elif target not in ACTIVE:
        reason = note or fields.get("termination_reason")
        close_attempt(session, job_id, closing_outcome(target, reason), reason, stamp)
    event = {"state": target, "termination_reason": fields.get("termination_reason")}
    if note is not None:
        event["reason"] = note
    session.add(JobEvent(job_id=job_id, kind="state", data=event, time=stamp))
    notify_state(session, job_id, stamp)
    if target in FINAL:
        notify_sweep(session, job_id, stamp)
    return True


def request_cancel(session: Session, job_id: int) -> bool:
    """Cancel idempotently: a queued or paused job ends at once, a launched one goes to `cancelling` for its worker.

    Returns False when the job was already final or cancelling (nothing to do).
    """
    if transition(session, job_id, CANCELLED, [QUEUED, PAUSED], termination_reason="user_cancelled"):
        return True
    return transition(session, job_id, CANCELLING, [STARTING, RUNNING, PAUSING])


def request_pause(session: Session, job_id: int) -> bool:
    """Pause idempotently: a queued job is paused at once (it stays out of the queue), a launched one goes to
    `pausing` for its worker, which checkpoints it. False when it was already pausing or paused, or could not
    be paused (ended, cancelling)."""
    if transition(session, job_id, PAUSED, [QUEUED], termination_reason="user_paused"):
        return True
    return transition(session, job_id, PAUSING, [STARTING, RUNNING])


def restart_budget(job: Job, server_max_restarts: int) -> int:
    """How many automatic restarts the job may have in all (its spec's max_restarts, else the server's)."""
    return server_max_restarts if job.max_restarts is None else job.max_restarts


REQUEUE_CLEARS: JobChanges = {
    "termination_reason": None,
    "error": None,
    "exit_code": None,
    "finished_at": None,
    "pid": None,
    "heartbeat_at": None,
}


def requeue(
    session: Session, job_id: int, expected: Iterable[str], note: str | None, **fields: Unpack[JobChanges]
) -> bool:
    """Put a job back in the queue (resume, an automatic restart, a worker shutting down); the caller
    publishes its id once this commits. The last attempt keeps why it ended (`note`). An elastic job that ran
    on fewer nodes asks for all of its nodes again (app/core/gangs.py `wanted_nodes`)."""
    changes: JobChanges = {**REQUEUE_CLEARS, **fields}
    job = session.get(Job, job_id)
    if job is not None and job.max_nodes is not None and "nodes" not in fields:
        changes["nodes"] = wanted_nodes(job)
    return transition(session, job_id, QUEUED, expected, note=note, **changes)


STOPPED_TO_KEEP = frozenset({"user_paused", "worker_shutdown", GROWN})  # stops that checkpoint the ranks first
ENDS_A_PAUSE = STOPPED_TO_KEEP | {"worker_lost"}  # a pausing job stopped by one of these is as paused as it gets


@dataclass(frozen=True)
class Settled:
    """Where `settle` moved a job; a job moved to `queued` must have its id published on `queue`."""

    state: str
    queue: str


def settle(
    session: Session,
    job_id: int,
    result: Result,
    termination: Termination | None,
    *,
    server_max_restarts: int,
    exit_code: int | None = None,
    may_requeue: bool = True,
    grow_to: int | None = None,
) -> Settled | None:
    """Record how a launched job's run ended, its processes gone: the worker's end of a run and the reaper's
    end of one whose worker died. None when the job had moved elsewhere meanwhile (deleted, ended, reaped).
    The caller commits, then publishes a requeued job's id.

        pausing, stopped by the pause, a shutdown or its worker's loss  -> paused (its checkpoints stay)
        cancelling, stopped by a pause or a shutdown                   -> cancelled (the cancel came after)
        starting or running, stopped by its worker shutting down       -> queued, no restart used
        starting or running, stopped to take a larger gang (`grow_to`)  -> queued for it, no restart used
        succeeded                                                      -> succeeded
        a fault of the machine, restarts left (`may_requeue`)          -> queued, one restart used
        otherwise                                                      -> failed or cancelled, with the reason
    """
    job = session.get(Job, job_id)
    if job is None or job.state not in ACTIVE:
        return None
    reason = termination.reason if termination else None
    moved = _settle_stop(session, job, reason, grow_to) or _settle_requeue(
        session, job, termination, restart_budget(job, server_max_restarts) if may_requeue else 0
    )
    if moved is None:
        moved = _settle_end(session, job, result, termination, exit_code)
    return None if moved is None else Settled(moved, job.queue)


def _settle_stop(session: Session, job: Job, reason: str | None, grow_to: int | None) -> str | None:
    """A run stopped by a pause, a shutdown or a larger gang taken (`grow_to` nodes: back to the queue for them),
    or, while pausing, by the loss of its worker."""
    assert job.id is not None
    if job.state == PAUSING and reason in ENDS_A_PAUSE:
        return (
            PAUSED
            if transition(session, job.id, PAUSED, [PAUSING], termination_reason="user_paused", pid=None)
            else None
        )
    if job.state == CANCELLING and reason in STOPPED_TO_KEEP:
        cancelled = transition(session, job.id, CANCELLED, [CANCELLING], termination_reason="user_cancelled", pid=None)
        return CANCELLED if cancelled else None
    if reason == "worker_shutdown" and requeue(session, job.id, [STARTING, RUNNING], reason):
        return QUEUED
    if reason == GROWN and grow_to is not None and requeue(session, job.id, [STARTING, RUNNING], reason, nodes=grow_to):
        return QUEUED
    return None


def _settle_requeue(session: Session, job: Job, termination: Termination | None, budget: int) -> str | None:
    """A fault of the machine, while the job has restarts left: back to the queue, one restart used."""
    assert job.id is not None
    if termination is None or not termination.retryable or job.restarts >= budget:
        return None
    requeued = requeue(session, job.id, [STARTING, RUNNING], termination.reason, restarts=job.restarts + 1)
    return QUEUED if requeued else None


def _settle_end(
    session: Session, job: Job, result: Result, termination: Termination | None, exit_code: int | None
) -> str | None:
    """The run's own end: succeeded, or failed or cancelled with its reason."""
    assert job.id is not None
    fields: JobChanges = {"pid": None}
    if result == SUCCEEDED:
        fields.update({"progress": 1.0, "phase_progress": 1.0, "exit_code": 0})
    else:
        reason, error = (termination.reason, termination.error) if termination else (None, None)
        fields.update({"termination_reason": reason, "error": error, "exit_code": exit_code})
    sources = [state for state in ACTIVE if result in ALLOWED_MOVES[state]]
    return result if transition(session, job.id, result, sources, **fields) else None
