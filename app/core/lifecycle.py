"""The job lifecycle: states, the table of allowed moves, and the one function that changes a state.

    queued -> starting -> running -> succeeded | failed | cancelled
                 \\           \\-> cancelling -> cancelled (| failed | succeeded, if it ended first)
                  \\-> cancelling, failed, cancelled;   queued -> cancelled | failed

Every change goes through `transition`, a compare-and-set `UPDATE ... WHERE state IN (...)`: of two
workers claiming the same job only one wins, and a final state is never left. Each change also
appends a `state` event for the job's event stream, in the same transaction.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, get_args

from sqlalchemy import update
from sqlmodel import Session

from app.core.tables import Job, JobEvent, now
from pipebd_core.outcomes import TERMINATION_REASONS

JobState = Literal["queued", "starting", "running", "cancelling", "succeeded", "failed", "cancelled"]
STATES: tuple[str, ...] = get_args(JobState)  # in lifecycle order
QUEUED, STARTING, RUNNING, CANCELLING, SUCCEEDED, FAILED, CANCELLED = STATES
FINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
ACTIVE = frozenset({STARTING, RUNNING, CANCELLING})  # a worker owns the job and may hold processes

ALLOWED_MOVES: dict[str, frozenset[str]] = {
    QUEUED: frozenset({STARTING, CANCELLED, FAILED}),
    STARTING: frozenset({RUNNING, CANCELLING, CANCELLED, FAILED}),
    RUNNING: frozenset({SUCCEEDED, FAILED, CANCELLING}),
    CANCELLING: frozenset({CANCELLED, FAILED, SUCCEEDED}),
    SUCCEEDED: frozenset(),
    FAILED: frozenset(),
    CANCELLED: frozenset(),
}


class TransitionError(ValueError):
    """A move the lifecycle table forbids: a bug in the caller, not a race."""


def check_move(source: str, target: str) -> None:
    if target not in ALLOWED_MOVES.get(source, frozenset()):
        allowed = ", ".join(sorted(ALLOWED_MOVES.get(source, ()))) or "nothing (final state)"
        raise TransitionError(
            f"a job cannot move from {source!r} to {target!r}; from {source!r} it may move to {allowed}"
        )


def transition(session: Session, job_id: int, target: str, expected: Iterable[str], **fields: Any) -> bool:
    """Move job `job_id` from one of `expected` to `target`, setting `fields`; False if it was in no such state.

    The caller commits. A final target also sets `finished_at`.
    """
    sources = sorted(set(expected))
    for source in sources:
        check_move(source, target)
    if fields.get("termination_reason") not in (None, *TERMINATION_REASONS):  # the table: pipebd_core.outcomes
        raise TransitionError(f"unknown termination_reason {fields['termination_reason']!r}")
    stamp = now()
    values: dict[str, Any] = {"state": target, "updated_at": stamp, **fields}
    if target in FINAL:
        values.setdefault("finished_at", stamp)
    statement = update(Job).where(Job.id == job_id, Job.state.in_(sources)).values(**values)  # type: ignore[attr-defined,arg-type]
    if session.execute(statement).rowcount != 1:  # type: ignore[attr-defined]
        return False
    event = {"state": target, "termination_reason": fields.get("termination_reason")}
    session.add(JobEvent(job_id=job_id, kind="state", data=event, time=stamp))
    return True


def request_cancel(session: Session, job_id: int) -> bool:
    """Cancel idempotently: a queued job ends at once, a launched one goes to `cancelling` for its worker.

    Returns False when the job was already final or cancelling (nothing to do).
    """
    if transition(session, job_id, CANCELLED, [QUEUED], termination_reason="user_cancelled"):
        return True
    return transition(session, job_id, CANCELLING, [STARTING, RUNNING])
