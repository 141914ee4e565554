"""Starting a worker process: migrate, clean up after a previous crash, advertise, consume.

Queues: a worker with D devices consumes `pipebd.ranks-1` .. `pipebd.ranks-D`, so a job needing N
ranks only reaches a worker that has N devices.
"""

from __future__ import annotations

import logging
import os

from app.core.database import migrate
from app.core.queue import queues_for
from app.core.reaper import reap_lost_jobs, reap_stale_seats
from app.core.settings import get_settings
from worker.devices import detect_devices
from worker.presence import Presence

log = logging.getLogger("pipebd.worker")
SECRETS = ("PIPEBD_API_TOKENS", "PIPEBD_DATABASE_URL", "PIPEBD_BROKER_URL")


def serve() -> int:
    """Run the Celery worker in this process until it is told to stop (reads PIPEBD_* settings)."""
    settings = get_settings()
    for secret in SECRETS:  # read once above; the ranks (user code) inherit this environment
        os.environ.pop(secret, None)
    settings.prepare_folders()
    migrate(settings.database)
    from worker.celery_app import celery_app  # after the settings are final: it reads them at import
    from worker.tasks import publish

    for job_id in reap_lost_jobs(
        settings.database, settings.stale_after_s, publish, settings.max_restarts, settings.host_id
    ):
        log.warning("job %s: its worker was lost (found at start-up)", job_id)
    for job_id in reap_stale_seats(settings.database, settings.gang_bound_s + settings.stale_after_s):
        log.warning("job %s: gang seats no worker gave up were dropped (found at start-up)", job_id)
    devices = settings.worker_devices or detect_devices()
    queues = queues_for(devices)

    presence = Presence(settings, devices, queues)
    print(
        f"pipebd worker {settings.worker_name}: {devices} devices, {settings.worker_slots} slot(s),"
        f" queues {','.join(queues)}",
        flush=True,
    )
    argv = [
        "worker",
        "--pool=threads",
        f"--concurrency={settings.worker_slots}",
        f"--queues={','.join(queues)}",
        f"--hostname={settings.worker_name}@%h",
        "--loglevel=INFO",
        "--without-gossip",
        "--without-mingle",
    ]
    try:
        celery_app.worker_main(argv)
    finally:
        presence.stop()
    return 0
