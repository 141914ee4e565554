"""Pausing and resuming jobs from the API: the checks, the moves and the broker message, all or nothing.

Resume puts a failed, cancelled or paused job back in the queue; the worker that takes it continues
in the same run directory, every block from its last checkpoint (worker/launcher.py). A job that
cannot resume gets a ConflictError naming why, and nothing changes: not in the database, not on
the broker. Pause is the lifecycle's `request_pause`: a queued job is paused at once, a launched one
is checkpointed by its worker.
"""

from __future__ import annotations

from pathlib import Path

from celery import Celery
from sqlmodel import Session

from app.core.lifecycle import request_pause, requeue
from app.core.queue import enqueue
from app.core.settings import Settings
from app.core.states import PAUSED, PAUSING, QUEUED, RESUMABLE
from app.core.tables import Job
from app.services.errors import ServiceError
from app.services.jobs import ConflictError
from app.services.specs import validate_document
from pipebd_core.rundir import RunDir

PAUSABLE = ("queued", "starting", "running")


def resume_problem(job: Job, settings: Settings) -> str | None:
    """Why the job cannot resume, or None."""
    if job.state not in RESUMABLE:
        return f"job {job.id} is {job.state}; only failed, cancelled or paused jobs resume" + (
            " (it is already queued)" if job.state == QUEUED else "; pause or cancel it first"
        )
    if job.run_dir is not None and not RunDir(Path(job.run_dir)).phases.exists():
        return (
            f"job {job.id}'s run directory {job.run_dir} is gone (or holds no phases.json), so there is"
            " nothing to continue from; submit its spec again as a new job"
        )
    try:
        validate_document(dict(job.spec), settings)
    except ServiceError as error:
        return f"job {job.id}'s spec no longer validates on this server: {error.detail}; submit a corrected spec"
    return None


def resume_job(session: Session, settings: Settings, celery: Celery, job: Job) -> None:
    """Queue the job again (a fresh restart budget) and publish its id, the message before the requeue commits
    (503, nothing changed, when the broker refuses it); ConflictError when it cannot."""
    assert job.id is not None
    problem = resume_problem(job, settings)
    if problem is not None:
        raise ConflictError(problem)
    if not requeue(session, job.id, [job.state], note=None, restarts=0):
        raise ConflictError(f"job {job.id} changed state meanwhile; read it and try again")
    # Published before the requeue commits: a broker that refuses the message leaves nothing that anyone saw (a
    # requeue committed, then taken back, had shown its `queued` event to the job's followers and stored its
    # webhooks; found by the soak, issue 42). A worker that takes the message first waits on the job's row,
    # locked by the requeue, until this commits; a commit that fails leaves a message whose claim finds the job
    # not queued and drops it.
    try:
        enqueue(celery, job.id, job.queue)
    except Exception as error:
        session.rollback()
        detail = f"the broker did not accept the job ({type(error).__name__}: {error}); nothing changed, retry"
        raise ServiceError(503, detail) from None
    session.commit()


def pause_job(session: Session, job: Job) -> None:
    """Pause idempotently; ConflictError for a job that has ended or is being cancelled."""
    assert job.id is not None
    if job.state in (PAUSING, PAUSED):
        return
    if job.state not in PAUSABLE or not request_pause(session, job.id):
        session.rollback()
        session.refresh(job)
        if job.state in (PAUSING, PAUSED):
            return
        raise ConflictError(
            f"job {job.id} is {job.state}; only queued, starting or running jobs can be paused"
            + ("; resume it instead" if job.state in RESUMABLE else "")
        )
    session.commit()
