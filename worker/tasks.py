"""Celery tasks: thin. A task is a wake-up carrying a job id; the worker takes the queued job that
should run first (app/core/priority.py) and hands it to the launcher, or, when that job spans several nodes,
takes a seat in the head gang (worker/gang.py). A wake that found no seat, or sat in a gang that did not form
within its bound, goes on to the next job that fits (a gang that cannot form never holds one-node jobs back
beside a free slot for longer than its bound)."""

from __future__ import annotations

import functools

from app.core.database import session_scope
from app.core.priority import next_queued
from app.core.queue import TASK_NAME, enqueue
from app.core.settings import get_settings
from app.core.tables import Job
from pipebd_core import devices
from worker.celery_app import celery_app, shutting_down
from worker.devices import DevicePool, detect_devices
from worker.gang import NOT_SEATED, RELEASED, take_part
from worker.launcher import JobRunner

CLAIM_TRIES = 3  # another worker may claim the chosen job first: choose again, this many times


@functools.lru_cache
def device_pool() -> DevicePool:
    settings = get_settings()
    return DevicePool(settings.worker_devices or detect_devices(), devices.cuda_available())


def publish(job_id: int, queue: str) -> None:
    """Put a requeued job's id back on the broker (launcher.Publish)."""
    enqueue(celery_app, job_id, queue)


def publish_later(job_id: int, queue: str, delay_s: float) -> None:
    """Wake a worker for the job after `delay_s` (a gang that did not complete tries again: worker/gang.py)."""
    enqueue(celery_app, job_id, queue, countdown=delay_s)


def needed(job_id: int) -> tuple[int, int] | None:
    """The job's ranks on each node and its node count; None once it is deleted."""
    with session_scope(get_settings().database) as session:
        job = session.get(Job, job_id)
        return None if job is None else (job.nproc, job.nodes)


def run(job_id: int) -> str:
    sizes = needed(job_id)
    if sizes is None:
        return "deleted"
    nproc, nodes = sizes
    with device_pool().take(nproc) as env:
        if nodes > 1 and not shutting_down.is_set():
            return take_part(get_settings(), shutting_down, env, publish, publish_later)
        return JobRunner(job_id, get_settings(), shutting_down, env, publish).run()


@celery_app.task(name=TASK_NAME)
def run_job(job_id: int) -> str:
    """Run the queued job that should run first on this node (the message's, or one of a higher priority);
    returns its state when this worker is done with it."""
    if shutting_down.is_set():
        return run(job_id)  # the launcher puts the message back: nothing is taken off the queue
    tried: set[int] = set()
    for _ in range(CLAIM_TRIES):
        chosen = next_queued(get_settings().database, device_pool().count, frozenset(tried))
        if chosen is None:
            return "not claimed"
        outcome = run(chosen)
        # a gang that did not form (RELEASED) holds nothing back: this wake goes on to the next job that fits
        if outcome not in ("not claimed", NOT_SEATED, RELEASED) or shutting_down.is_set():
            return outcome
        tried.add(chosen)
    return "not claimed"
