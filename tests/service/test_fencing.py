"""Service tier, on real SQLite and PostgreSQL: a run whose claim on a job was taken over (the reaper requeued the
job, another worker claimed it) prepares nothing (worker/launcher.py `JobRunner.fenced`): whether its claim was
taken before it read the job or while it prepared it, it leaves the other claim's row, attempts and events as they
are, and one that lost its claim before it began creates no run directory. A gang's node 0 whose claim was taken
over removes only its own seat when it ends, never the seats of the gang that took the job, and one whose claim is
taken over as it claims publishes no endpoint and records no hosts."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlmodel import Session, col, select

from app.core import gangs
from app.core.attempts import attempts_of
from app.core.database import get_engine, session_scope
from app.core.lifecycle import requeue
from app.core.settings import Settings
from app.core.states import QUEUED, STARTING
from app.core.tables import GangSeat, Job, JobEvent
from tests.service.conftest import make_settings
from tests.service.factories import queued_job, tiny_job
from worker.gang import GangLeader
from worker.launcher import JobRunner


def take_over(settings: Settings, job_id: int) -> JobRunner:
    """What a stale claim meets: the reaper requeues the job (`worker_lost`), worker-b claims it; worker-b's runner."""
    with session_scope(settings.database) as session:
        assert requeue(session, job_id, [STARTING], "worker_lost")
    other = make_settings(settings.data_dir.parent, settings.database, worker_name="worker-b", host_id="host-b")
    runner = JobRunner(job_id, other, threading.Event())
    assert runner.claim()
    return runner


def snapshot(settings: Settings, job_id: int) -> tuple[dict[str, Any], list[dict[str, Any]], list[Any]]:
    """The job's row, its attempts and its events, as the database holds them now."""
    with Session(get_engine(settings.database)) as session:
        job = session.get(Job, job_id)
        assert job is not None
        attempts = [attempt.model_dump() for attempt in attempts_of(session, job_id)]
        query = select(JobEvent.kind, JobEvent.data).where(JobEvent.job_id == job_id).order_by(col(JobEvent.id))
        return job.model_dump(), attempts, list(session.exec(query).all())


class TakenOverWhilePreparing(JobRunner):
    """A run whose job is taken over (`take_over`) right after its first transaction: while it prepares the job."""

    taken: JobRunner | None = None

    @contextmanager
    def fenced(self, ending: bool = False) -> Iterator[Session]:
        with super().fenced(ending) as session:
            yield session
        if self.taken is None:
            self.taken = take_over(self.settings, self.job_id)


@pytest.mark.parametrize("when", ["before", "while"])
def test_a_run_whose_claim_was_taken_over_prepares_nothing(settings: Settings, when: str) -> None:
    job_id = queued_job(settings, tiny_job())
    stale = (JobRunner if when == "before" else TakenOverWhilePreparing)(job_id, settings, threading.Event())
    assert stale.claim()
    if when == "before":
        take_over(settings, job_id)
    else:
        assert isinstance(stale, TakenOverWhilePreparing) and stale.taken is None
    before = snapshot(settings, job_id) if when == "before" else None
    run_dirs = sorted(settings.runs.iterdir()) if settings.runs.exists() else []
    assert stale.prepare() is None
    job, attempts, events = snapshot(settings, job_id)
    if before is not None:
        assert (job, attempts, events) == before
        assert (sorted(settings.runs.iterdir()) if settings.runs.exists() else []) == run_dirs
    # the other claim's: starting on worker-b, no run directory yet, its attempt with no shape; the first requeued
    assert (job["state"], job["worker"], job["run_dir"]) == (STARTING, "worker-b", None)
    shapes = [(a["number"], a["worker"], a["outcome"], a["nodes"], a["nproc"], a["resumed_from"]) for a in attempts]
    assert shapes == [(1, settings.worker_name, "requeued", None, None, None), (2, "worker-b", None, None, None, None)]
    assert [data["state"] for kind, data in events if kind == "state"] == [QUEUED, STARTING, QUEUED, STARTING]


def seated_gang(settings: Settings) -> tuple[int, GangSeat]:
    """A queued 2-node job whose gang sat down: this worker's host as node 0 (its seat returned), host-c as node 1."""
    job_id = queued_job(settings, tiny_job(schedule={"nodes": 2, "nproc": 1}))
    with session_scope(settings.database) as session:
        seat = gangs.take_seat(session, host=settings.host_id, worker=settings.worker_name)
        assert seat is not None and gangs.take_seat(session, host="host-c", worker="worker-c") is not None
    return job_id, seat


def test_a_gang_leader_whose_claim_was_taken_over_leaves_the_new_gangs_seats(settings: Settings) -> None:
    job_id, seat = seated_gang(settings)
    stale = GangLeader(job_id, settings, threading.Event(), seat, 2, {}, lambda *_: None)
    assert stale.claim()
    with session_scope(settings.database) as session:  # the reaper drops the gang and requeues the job ...
        gangs.dissolve(session, job_id)
        assert requeue(session, job_id, [STARTING], "worker_lost")
        session.commit()
        for host in ("host-b", "host-d"):  # ... and a new gang forms on two other hosts, worker-b its node 0
            assert gangs.take_seat(session, host=host, worker=host.replace("host", "worker")) is not None
    other = make_settings(settings.data_dir.parent, settings.database, worker_name="worker-b", host_id="host-b")
    assert JobRunner(job_id, other, threading.Event()).claim()
    stale._dissolve()  # what the stale node 0 does as its run ends
    with session_scope(settings.database) as session:
        assert [(seat.node, seat.host) for seat in gangs.seats(session, job_id)] == [(0, "host-b"), (1, "host-d")]


class TakenOverAsItClaims(GangLeader):
    """Node 0 of a gang whose job is taken over (`take_over`) between its claim and its endpoint's publication."""

    @contextmanager
    def fenced(self, ending: bool = False) -> Iterator[Session]:
        take_over(self.settings, self.job_id)
        with super().fenced(ending) as session:
            yield session


def test_a_gang_leader_whose_claim_is_taken_over_as_it_claims_publishes_nothing(settings: Settings) -> None:
    job_id, seat = seated_gang(settings)
    assert not TakenOverAsItClaims(job_id, settings, threading.Event(), seat, 2, {}, lambda *_: None).claim()
    with session_scope(settings.database) as session:
        assert [seat.endpoint for seat in gangs.seats(session, job_id)] == [None, None]
        hosts = [(attempt.worker, attempt.hosts) for attempt in attempts_of(session, job_id)]
    # each attempt names its own claim's host; the stale gang's hosts (node 0's and host-c) are recorded nowhere
    assert hosts == [(settings.worker_name, [settings.host_id]), ("worker-b", ["host-b"])]
