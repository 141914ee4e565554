"""The Celery side shared by the API (which enqueues job ids) and the workers (which consume them).

A job that needs N ranks goes to the queue `pipebd.ranks-N`; a worker with D devices consumes the
queues for 1..D ranks, so a job only ever reaches a worker that can run it. Messages carry only the
job id: the database holds the job.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from celery import Celery
from kombu.transport import sqlalchemy as kombu_sqlalchemy

from app.core.settings import Settings

TASK_NAME = "pipebd.run_job"
SQLITE_BROKER_POLL_S = 0.1  # how often a worker polls the SQLite broker for a new message
PUBLISH_RETRY: dict[str, float] = {"max_retries": 2, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 1.0}


def queue_name(nproc: int) -> str:
    return f"pipebd.ranks-{nproc}"


def queues_for(devices: int) -> list[str]:
    """The queues a worker with `devices` devices consumes: every job size it can run."""
    return [queue_name(n) for n in range(1, devices + 1)]


class CeleryConfig(TypedDict):
    """The Celery settings of the API and the workers (celery.conf.update takes them by name)."""

    broker_url: str
    task_acks_late: bool
    task_reject_on_worker_lost: bool
    worker_prefetch_multiplier: int
    task_default_queue: str
    broker_connection_retry_on_startup: bool
    task_publish_retry_policy: dict[str, float]
    worker_hijack_root_logger: bool
    broker_transport_options: NotRequired[dict[str, float | dict[str, float]]]


def celery_config(settings: Settings) -> CeleryConfig:
    config: CeleryConfig = {
        "broker_url": settings.broker,
        "task_acks_late": True,  # a message is done when the job is, not when a worker takes it
        "task_reject_on_worker_lost": False,  # a lost worker's job is failed (worker_lost), not rerun
        "worker_prefetch_multiplier": 1,  # never reserve a job another idle worker could start now
        "task_default_queue": queue_name(1),
        "broker_connection_retry_on_startup": True,
        "task_publish_retry_policy": PUBLISH_RETRY,
        "worker_hijack_root_logger": False,
    }
    if settings.broker.startswith("sqla+sqlite"):
        # kombu passes sqla transport options to create_engine: wait on a locked SQLite file instead of failing
        config["broker_transport_options"] = {"connect_args": {"timeout": 30}}
    else:
        config["broker_transport_options"] = {"visibility_timeout": 7 * 24 * 3600}  # jobs may run for days
    return config


def make_celery(settings: Settings) -> Celery:
    if settings.broker.startswith("sqla+"):
        # The polling interval is a class attribute: kombu would hand it to create_engine as an option.
        kombu_sqlalchemy.Transport.polling_interval = SQLITE_BROKER_POLL_S
    celery = Celery("pipebd")
    celery.conf.update(celery_config(settings))
    return celery


def enqueue(celery: Celery, job_id: int, queue: str, countdown: float | None = None) -> None:
    """Publish the job id (delivered after `countdown` seconds, if given); raises when the broker cannot take it."""
    celery.send_task(TASK_NAME, args=[job_id], queue=queue, countdown=countdown, retry=True, retry_policy=PUBLISH_RETRY)
