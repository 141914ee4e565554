"""A worker's row in the `worker` table: what it offers and that it is alive (a heartbeat thread).

The API reads these rows to say why a queued job waits and to export worker heartbeats to Prometheus.
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy import func
from sqlmodel import col, select

from app.core.database import session_scope
from app.core.settings import Settings
from app.core.states import ACTIVE
from app.core.tables import Job, Worker, now

log = logging.getLogger("pipebd.worker")


def announce(settings: Settings, devices: int, queues: list[str]) -> None:
    """Create or refresh this worker's row."""
    with session_scope(settings.database) as session:
        row = session.get(Worker, settings.worker_name) or Worker(
            name=settings.worker_name,
            host=settings.host_id,
            devices=devices,
            slots=settings.worker_slots,
            queues="",
        )
        row.host, row.devices, row.slots, row.queues = (  # the host as gangs name it (`pipebd worker --host-id`)
            settings.host_id,
            devices,
            settings.worker_slots,
            ",".join(queues),
        )
        row.started_at = row.last_seen = now()
        session.add(row)


def beat(settings: Settings) -> None:
    with session_scope(settings.database) as session:
        row = session.get(Worker, settings.worker_name)
        if row is None:
            return
        active = (
            select(func.count())
            .select_from(Job)
            .where(Job.worker == settings.worker_name, col(Job.state).in_(sorted(ACTIVE)))
        )
        row.running = int(session.exec(active).one())
        row.last_seen = now()
        session.add(row)


def retire(settings: Settings) -> None:
    with session_scope(settings.database) as session:
        row = session.get(Worker, settings.worker_name)
        if row is not None:
            session.delete(row)


class Presence:
    """Heartbeats every `settings.heartbeat_s` until stopped."""

    def __init__(self, settings: Settings, devices: int, queues: list[str]) -> None:
        self.settings = settings
        self.stopped = threading.Event()
        announce(settings, devices, queues)
        self.thread = threading.Thread(target=self._loop, name="presence", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stopped.wait(self.settings.heartbeat_s):
            try:
                beat(self.settings)
            except Exception:  # the database may blink; the next beat retries
                log.exception("worker heartbeat failed")

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)
        retire(self.settings)
