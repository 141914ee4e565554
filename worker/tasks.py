"""Celery tasks: thin. A task takes a job id and hands it to the launcher."""

from __future__ import annotations

import functools

from app.core.database import session_scope
from app.core.queue import TASK_NAME, enqueue
from app.core.settings import get_settings
from app.core.tables import Job
from worker.celery_app import celery_app, shutting_down
from worker.devices import DevicePool, detect_devices
from worker.launcher import JobRunner


@functools.lru_cache
def device_pool() -> DevicePool:
    import torch

    settings = get_settings()
    return DevicePool(settings.worker_devices or detect_devices(), torch.cuda.is_available())


def publish(job_id: int, queue: str) -> None:
    """Put a requeued job's id back on the broker (launcher.Publish)."""
    enqueue(celery_app, job_id, queue)


def needed_ranks(job_id: int) -> int | None:
    with session_scope(get_settings().database) as session:
        job = session.get(Job, job_id)
        return None if job is None else job.nproc


@celery_app.task(name=TASK_NAME)
def run_job(job_id: int) -> str:
    """Run job `job_id` to a final state on this node; returns that state."""
    nproc = needed_ranks(job_id)
    if nproc is None:
        return "deleted"
    with device_pool().take(nproc) as env:
        return JobRunner(job_id, get_settings(), shutting_down, env, publish).run()
