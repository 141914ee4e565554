"""Webhooks, the enqueueing side: the events a hook may choose, which hooks want an event, and the rows
that carry it to them.

    job.<state>      a job moved to that state (queued, starting, running, pausing, paused, cancelling,
                     succeeded, failed, cancelled): app/core/lifecycle.py `transition`, and a submission
    phase.finished   a phase of a job ended (succeeded, failed, cancelled or skipped): the worker's watcher
    sweep.finished       every child of a sweep ended: app/core/sweep_events.py, in the last child's move
    sweep.best_changed   a child's end made another child the sweep's best by its objective: the same

A hook's scope says whose jobs it hears: `server` (every job and sweep), `token` (the jobs and sweeps
submitted with the token that created it, `Job.tenant`), `job` (one job's own events), `sweep` (one sweep's
events and its children's).

Whoever moves a job calls `notify_state` or `notify_phases` in the transaction of the move: a delivery row
per interested hook is stored with it, or neither is, so no event is lost and none is sent for a move that
did not happen. Sending is app/core/deliveries.py's, off every request and job path: a receiver that is down
or slow changes nothing for the job.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import and_, delete, or_
from sqlmodel import Session, col, select

from app.core.job_phases import PhaseEntry
from app.core.tables import Job, Webhook, WebhookDelivery, iso_utc
from pipebd_core.documents.phases import ENDED, PhaseRecord
from pipebd_core.documents.webhook import WebhookJob, WebhookPayload, WebhookPhase

SERVER, TOKEN, JOB, SWEEP = "server", "token", "job", "sweep"
SCOPES = (SERVER, TOKEN, JOB, SWEEP)
PHASE_FINISHED = "phase.finished"
SWEEP_FINISHED, SWEEP_BEST_CHANGED = "sweep.finished", "sweep.best_changed"
SWEEP_EVENTS = (SWEEP_FINISHED, SWEEP_BEST_CHANGED)
PENDING, SUCCEEDED, FAILED = "pending", "succeeded", "failed"  # a delivery's states
DELIVERY_STATES = (PENDING, SUCCEEDED, FAILED)
ERROR_CHARS = 500  # the most of a job's error text (a rank's traceback) a payload carries


def job_event(state: str) -> str:
    """The event of a job moving to `state`: `job.succeeded`."""
    return f"job.{state}"


def event_names(states: Sequence[str]) -> tuple[str, ...]:
    """Every event a hook may choose, given the job states (app/core/states.py STATES)."""
    return (*(job_event(state) for state in states), PHASE_FINISHED, *SWEEP_EVENTS)


def hooks_for(session: Session, event: str, job: Job) -> list[Webhook]:
    """The hooks that hear `event` about `job` (for a sweep's event: about the child whose move raised it):
    server-wide ones, its submitter token's, its sweep's, and for its own events the job's."""
    heard: list[Any] = [col(Webhook.scope) == SERVER]
    if event not in SWEEP_EVENTS:
        heard.append(and_(col(Webhook.scope) == JOB, col(Webhook.job_id) == job.id))
    if job.tenant is not None:
        heard.append(and_(col(Webhook.scope) == TOKEN, col(Webhook.tenant) == job.tenant))
    if job.sweep_id is not None:
        heard.append(and_(col(Webhook.scope) == SWEEP, col(Webhook.sweep_id) == job.sweep_id))
    hooks = session.exec(select(Webhook).where(or_(*heard)).order_by(col(Webhook.id))).all()
    return [hook for hook in hooks if event in hook.events]


def job_snapshot(job: Job) -> WebhookJob:
    assert job.id is not None
    error = job.error if job.error is None or len(job.error) <= ERROR_CHARS else job.error[:ERROR_CHARS] + "..."
    return WebhookJob(
        id=job.id,
        name=job.name,
        state=job.state,
        phase=job.phase,
        progress=job.progress,
        termination_reason=job.termination_reason,
        error=error,
        url=None,  # the sender adds it (app/core/deliveries.py: it knows the server's public address)
    )


def state_text(job: Job) -> str:
    """`PipeBD job 3 (tiny): failed (rank_error: ValueError: bad block)`."""
    why = [part for part in (job.termination_reason, first_line(job.error)) if part]
    return f"PipeBD job {job.id} ({job.name}): {job.state}" + (f" ({': '.join(why)})" if why else "")


def phase_text(job: Job, phase: WebhookPhase) -> str:
    """`PipeBD job 3 (tiny): phase distill succeeded in 12.5 s`."""
    took = f" in {phase.duration_s:.1f} s" if phase.duration_s is not None and phase.outcome != "skipped" else ""
    why = f" ({phase.reason})" if phase.reason else ""
    return f"PipeBD job {job.id} ({job.name}): phase {phase.name} {phase.outcome}{took}{why}"


def first_line(text: str | None) -> str | None:
    line = next((line.strip() for line in (text or "").splitlines() if line.strip()), None)
    return None if line is None else line[:200]


def enqueue(session: Session, job: Job, payload: WebhookPayload) -> int:
    """A pending delivery of `payload` to every hook that hears it; how many. The caller commits."""
    hooks = hooks_for(session, payload.event, job)
    body = payload.to_json()
    for hook in hooks:
        assert hook.id is not None
        session.add(WebhookDelivery(webhook_id=hook.id, event=payload.event, job_id=job.id, payload=body))
    return len(hooks)


def current_job(session: Session, job_id: int) -> Job | None:
    """The job as this transaction sees it now (after a compare-and-set UPDATE)."""
    return session.get(Job, job_id, populate_existing=True)


def notify_state(session: Session, job_id: int, stamp: float) -> int:
    """Enqueue `job.<state>` for the state job `job_id` just moved to (in the caller's transaction)."""
    job = current_job(session, job_id)
    if job is None:
        return 0
    event, text = job_event(job.state), state_text(job)
    payload = WebhookPayload(event=event, time=iso_utc(stamp), text=text, job=job_snapshot(job))
    return enqueue(session, job, payload)


def finished_phases(before: Sequence[PhaseEntry] | None, after: Sequence[PhaseRecord]) -> list[PhaseRecord]:
    """The phases that ended between two records of a job's phases (a phase run again ends again)."""
    previous = list(before or [])
    ended = []
    for index, record in enumerate(after):
        old = previous[index] if index < len(previous) and previous[index].get("name") == record.name else None
        if record.state == ENDED and (
            old is None or old.get("state") != ENDED or old.get("ended_at") != record.ended_at
        ):
            ended.append(record)
    return ended


def notify_phases(
    session: Session, job_id: int, before: Sequence[PhaseEntry] | None, after: Sequence[PhaseRecord]
) -> int:
    """Enqueue `phase.finished` for each phase that ended since `before` (in the caller's transaction)."""
    ended = finished_phases(before, after)
    job = current_job(session, job_id) if ended else None
    if job is None:
        return 0
    count = 0
    for record in ended:
        assert record.outcome is not None
        phase = WebhookPhase(
            name=record.name, outcome=record.outcome, reason=record.reason, duration_s=record.duration_s
        )
        stamp = iso_utc(record.ended_at or job.updated_at)
        text = phase_text(job, phase)
        payload = WebhookPayload(event=PHASE_FINISHED, time=stamp, text=text, job=job_snapshot(job), phase=phase)
        count += enqueue(session, job, payload)
    return count


def forget_sweep(session: Session, sweep_id: int) -> None:
    """Delete the hooks scoped to a sweep that is being deleted, with their deliveries."""
    hooks = select(Webhook.id).where(col(Webhook.scope) == SWEEP, col(Webhook.sweep_id) == sweep_id)
    session.execute(delete(WebhookDelivery).where(col(WebhookDelivery.webhook_id).in_(hooks)))
    session.execute(delete(Webhook).where(col(Webhook.scope) == SWEEP, col(Webhook.sweep_id) == sweep_id))


def forget_job(session: Session, job_id: int, *, unsent: bool) -> None:
    """Delete the hooks scoped to a job that is being deleted, with their deliveries; `unsent`: also its
    pending deliveries to other hooks (a job that never existed: its submission was undone)."""
    hooks = select(Webhook.id).where(col(Webhook.scope) == JOB, col(Webhook.job_id) == job_id)
    session.execute(delete(WebhookDelivery).where(col(WebhookDelivery.webhook_id).in_(hooks)))
    session.execute(delete(Webhook).where(col(Webhook.scope) == JOB, col(Webhook.job_id) == job_id))
    if unsent:
        pending = and_(col(WebhookDelivery.job_id) == job_id, col(WebhookDelivery.state) == PENDING)
        session.execute(delete(WebhookDelivery).where(pending))
