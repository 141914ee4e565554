"""The job lifecycle: states, the table of allowed moves, and the one function that changes a state.

    queued -> starting -> running -> succeeded | failed | cancelled
                 \\           \\-> cancelling -> cancelled (| failed | succeeded, if it ended first)
                  \\           \\-> pausing -> paused (| succeeded | failed, if it ended first; | cancelling)
                   \\-> cancelling, pausing, failed, cancelled;   queued -> cancelled | failed | paused
    starting | running | pausing -> queued       requeued: an infrastructure fault or the worker shut down
    failed | cancelled | paused -> queued         resumed by a user (POST .../resume)
    paused -> cancelled

Every change goes through `transition`, a compare-and-set `UPDATE ... WHERE state IN (...)`: of two
workers claiming the same job only one wins, and of a pause, a cancel and a job finishing only the
first move from a given state wins. Each change also appends a `state` event for the job's event
stream, and keeps the job's attempts (app/core/attempts.py) in step, in the same transaction: a claim
opens an attempt, any move off the worker closes it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, get_args

from sqlalchemy import update
from sqlmodel import Session

from app.core.attempts import close_attempt, open_attempt
from app.core.settings import Settings
from app.core.tables import Job, JobEvent, now
from pipebd_core.outcomes import TERMINATION_REASONS

JobState = Literal[
    "queued", "starting", "running", "pausing", "paused", "cancelling", "succeeded", "failed", "cancelled"
]
STATES: tuple[str, ...] = get_args(JobState)  # in lifecycle order
QUEUED, STARTING, RUNNING, PAUSING, PAUSED, CANCELLING, SUCCEEDED, FAILED, CANCELLED = STATES
FINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})  # ended (failed and cancelled ones may be resumed)
ACTIVE = frozenset({STARTING, RUNNING, PAUSING, CANCELLING})  # a worker owns the job and may hold processes
RESUMABLE = frozenset({FAILED, CANCELLED, PAUSED})  # POST .../resume puts these back in the queue
AT_REST = FINAL | {PAUSED}  # no worker holds it and none will take it: it may be deleted

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


def transition(
    session: Session, job_id: int, target: str, expected: Iterable[str], *, note: str | None = None, **fields: Any
) -> bool:
    """Move job `job_id` from one of `expected` to `target`, setting `fields`; False if it was in no such state.

    The caller commits. A final target also sets `finished_at`. `note` is the reason recorded on the
    attempt a move off the worker closes (default: the termination_reason).
    """
    sources = sorted(set(expected))
    for source in sources:
        check_move(source, target)
    for reason in (fields.get("termination_reason"), note):
        if reason not in (None, *TERMINATION_REASONS):  # the table: pipebd_core.outcomes
            raise TransitionError(f"unknown termination_reason {reason!r}")
    stamp = now()
    values: dict[str, Any] = {"state": target, "updated_at": stamp, **fields}
    if target in FINAL:
        values.setdefault("finished_at", stamp)
    statement = update(Job).where(Job.id == job_id, Job.state.in_(sources)).values(**values)  # type: ignore[attr-defined,arg-type]
    if session.execute(statement).rowcount != 1:  # type: ignore[attr-defined]
        return False
    if target == STARTING:
        open_attempt(session, job_id, fields.get("worker"), stamp)
    elif target not in ACTIVE:
        outcome = "requeued" if target == QUEUED else target
        close_attempt(session, job_id, outcome, note or fields.get("termination_reason"), stamp)
    event = {"state": target, "termination_reason": fields.get("termination_reason")}
    if note is not None:
        event["reason"] = note
    session.add(JobEvent(job_id=job_id, kind="state", data=event, time=stamp))
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


def restart_budget(job: Job, settings: Settings) -> int:
    """How many automatic restarts the job may have in all (its spec's max_restarts, else the server's)."""
    return settings.max_restarts if job.max_restarts is None else job.max_restarts


REQUEUE_CLEARS: dict[str, Any] = {
    "termination_reason": None,
    "error": None,
    "exit_code": None,
    "finished_at": None,
    "pid": None,
    "heartbeat_at": None,
}


def requeue(session: Session, job_id: int, expected: Iterable[str], note: str | None, **fields: Any) -> bool:
    """Put a job back in the queue (resume, an automatic restart, a worker shutting down); the caller
    publishes its id once this commits. The last attempt keeps why it ended (`note`)."""
    return transition(session, job_id, QUEUED, expected, note=note, **{**REQUEUE_CLEARS, **fields})
