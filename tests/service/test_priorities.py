"""Service tier: which queued job a free worker takes (app/core/priority.py), on real databases: the
highest priority that fits its devices, the oldest first within a priority; paused and running jobs
are not in the queue. Every job the service tests run goes through this choice (worker/tasks.py)."""

from __future__ import annotations

from sqlmodel import Session

from app.core.database import get_engine, migrate
from app.core.priority import next_queued, rewake_stranded
from app.core.settings import Settings
from app.core.tables import Worker, now
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


def test_a_job_queued_long_beside_a_worker_with_room_is_published_again_once_an_interval(settings: Settings) -> None:
    """A broker that lost its messages (Redis restarted) must not leave queued jobs asleep beside idle workers."""
    migrate(settings.database)
    stamp = now()
    old, fresh, big = ids(
        insert_job(settings, nproc=2, updated_at=stamp - 100),
        insert_job(settings, nproc=2, updated_at=stamp),  # its own message is still on its way
        insert_job(settings, nproc=4, updated_at=stamp - 100),  # no worker has 4 devices
    )
    insert_job(settings, "paused", nproc=1, updated_at=stamp - 100)
    with Session(get_engine(settings.database)) as session:
        session.add(Worker(name="busy", host="h1", devices=8, slots=1, queues="", running=1, last_seen=stamp))
        session.add(Worker(name="gone", host="h2", devices=8, slots=1, queues="", last_seen=stamp - 100))
        session.add(Worker(name="idle", host="h3", devices=2, slots=2, queues="", running=1, last_seen=stamp))
        session.commit()
    published: list[tuple[int, str]] = []
    woken: dict[int, float] = {}

    def rewake() -> list[int]:
        return rewake_stranded(settings.database, lambda *m: published.append(m), 60, 30, woken)

    assert rewake() == [old] and published == [(old, "pipebd.ranks-2")]
    assert rewake() == [] and published == [(old, "pipebd.ranks-2")]  # not again within the interval
    woken[old] -= 61
    assert rewake() == [old] and fresh not in woken and big not in woken
