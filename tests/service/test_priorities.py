"""Service tier: which queued job a free worker takes (app/core/priority.py), on real databases: the
highest priority that fits its devices, the oldest first within a priority; paused and running jobs
are not in the queue. Every job the service tests run goes through this choice (worker/tasks.py)."""

from __future__ import annotations

from app.core.database import migrate
from app.core.priority import next_queued
from app.core.settings import Settings
from tests.service.factories import insert_job


def ids(*jobs: object) -> list[int]:
    return [job.id for job in jobs]  # type: ignore[attr-defined]


def test_a_free_worker_takes_the_highest_priority_job_that_fits_oldest_first(settings: Settings) -> None:
    migrate(settings.database)
    low, low_too, big, high = ids(
        insert_job(settings, priority=0, nproc=1),
        insert_job(settings, priority=0, nproc=1),
        insert_job(settings, priority=9, nproc=4),  # more ranks than a 2-device worker has
        insert_job(settings, priority=5, nproc=2),
    )
    insert_job(settings, "paused", priority=50, nproc=1)
    insert_job(settings, "running", priority=50, nproc=1)
    assert next_queued(settings.database, 4) == big
    assert next_queued(settings.database, 2) == high
    assert next_queued(settings.database, 1) == low
    assert next_queued(settings.database, 2, frozenset({high})) == low  # another worker claimed `high` first
    assert next_queued(settings.database, 2, frozenset({high, low})) == low_too
    assert next_queued(settings.database, 1, frozenset({low, low_too})) is None
