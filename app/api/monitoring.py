"""Operations: `/healthz` (database and broker reachable) and Prometheus metrics read from the database.

Prometheus series: `pipebd_jobs{state}`, `pipebd_queue_depth{queue}`, `pipebd_worker_last_seen_seconds{worker}`,
`pipebd_worker_heartbeat_age_seconds{worker}`, `pipebd_worker_devices{worker}`,
`pipebd_worker_running_jobs{worker}`, and for running jobs `pipebd_job_samples_per_second{job_id,name}`
and `pipebd_job_progress_ratio{job_id,name}`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from celery import Celery
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func
from sqlmodel import select

from app.core.database import ping, session_scope
from app.core.states import QUEUED, RUNNING, STATES
from app.core.tables import Job, Worker

BROKER_TIMEOUT_S = 3.0


def check_database(database: str) -> str:
    try:
        ping(database)
    except Exception as error:
        return f"unreachable: {type(error).__name__}: {error}"
    return "ok"


def check_broker(celery: Celery) -> str:
    try:
        with celery.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_S)
            connection.default_channel  # noqa: B018  (opens a channel: Redis pings, SQLite opens its tables)
    except Exception as error:
        return f"unreachable: {type(error).__name__}: {error}"
    return "ok"


class JobCollector(Collector):
    """Reads the database at every scrape, so every API replica reports the same numbers."""

    def __init__(self, database: str) -> None:
        self.database = database

    def collect(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("pipebd_jobs", "Jobs by state", labels=["state"])
        queues = GaugeMetricFamily("pipebd_queue_depth", "Queued jobs per queue (ranks needed)", labels=["queue"])
        seen = GaugeMetricFamily(
            "pipebd_worker_last_seen_seconds", "Last worker heartbeat (Unix time)", labels=["worker"]
        )
        age = GaugeMetricFamily("pipebd_worker_heartbeat_age_seconds", "Seconds since the heartbeat", labels=["worker"])
        devices = GaugeMetricFamily("pipebd_worker_devices", "Devices a worker advertises", labels=["worker"])
        running = GaugeMetricFamily("pipebd_worker_running_jobs", "Jobs a worker runs now", labels=["worker"])
        speed = GaugeMetricFamily(
            "pipebd_job_samples_per_second", "Throughput of running jobs", labels=["job_id", "name"]
        )
        progress = GaugeMetricFamily(
            "pipebd_job_progress_ratio", "Fraction done of running jobs", labels=["job_id", "name"]
        )
        with session_scope(self.database) as session:
            counts = dict(session.exec(select(Job.state, func.count()).group_by(Job.state)).all())
            for state in STATES:
                jobs.add_metric([state], counts.get(state, 0))
            depth = session.exec(select(Job.queue, func.count()).where(Job.state == QUEUED).group_by(Job.queue)).all()
            for queue, count in depth:
                queues.add_metric([queue], count)
            now = time.time()
            for worker in session.exec(select(Worker)).all():
                seen.add_metric([worker.name], worker.last_seen)
                age.add_metric([worker.name], now - worker.last_seen)
                devices.add_metric([worker.name], worker.devices)
                running.add_metric([worker.name], worker.running)
            for job in session.exec(select(Job).where(Job.state == RUNNING)).all():
                speed.add_metric([str(job.id), job.name], job.samples_per_s or 0.0)
                progress.add_metric([str(job.id), job.name], job.progress)
        yield from (jobs, queues, seen, age, devices, running, speed, progress)
