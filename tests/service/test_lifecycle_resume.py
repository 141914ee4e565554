"""Service tier: the lifecycle's pause, resume and requeue moves and the attempts they record, on real
databases (SQLite and PostgreSQL), including races between a pause, a cancel and a job finishing."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from sqlmodel import Session

from app.core.attempts import attempts_of, record_resume
from app.core.database import get_engine, migrate
from app.core.lifecycle import request_cancel, request_pause, requeue, transition
from app.core.settings import Settings
from app.core.states import CANCELLED, CANCELLING, FAILED, PAUSED, PAUSING, QUEUED, RUNNING, STARTING, SUCCEEDED
from tests.service.factories import insert_job, stored


@pytest.fixture
def db(settings: Settings) -> Settings:
    migrate(settings.database)
    return settings


def moved(settings: Settings, job_id: int, target: str, expected: list[str], **fields: object) -> bool:
    with Session(get_engine(settings.database)) as session:
        done = transition(session, job_id, target, expected, **fields)
        session.commit()
        return done


def test_pause_a_queued_job_keeps_it_out_of_the_queue_and_resume_puts_it_back(db: Settings) -> None:
    job_id = insert_job(db).id
    assert job_id is not None
    with Session(get_engine(db.database)) as session:
        assert request_pause(session, job_id)
        assert not request_pause(session, job_id)  # already paused: nothing to do
        session.commit()
    assert stored(db, job_id).state == PAUSED
    assert not moved(db, job_id, STARTING, [QUEUED], worker="w1")  # a worker that gets its message cannot claim it
    with Session(get_engine(db.database)) as session:
        assert requeue(session, job_id, [PAUSED], note=None)
        session.commit()
    job = stored(db, job_id)
    assert job.state == QUEUED and job.termination_reason is None and job.finished_at is None
    with Session(get_engine(db.database)) as session:
        assert attempts_of(session, job_id) == []  # it never ran


def test_pause_of_a_running_job_goes_through_pausing_and_closes_its_attempt(db: Settings) -> None:
    job_id = insert_job(db).id
    assert job_id is not None
    assert moved(db, job_id, STARTING, [QUEUED], worker="w1") and moved(db, job_id, RUNNING, [STARTING])
    with Session(get_engine(db.database)) as session:
        record_resume(session, job_id, [0, 0])
        assert request_pause(session, job_id)
        session.commit()
    assert stored(db, job_id).state == PAUSING
    assert moved(db, job_id, PAUSED, [PAUSING], termination_reason="user_paused")
    with Session(get_engine(db.database)) as session:
        assert requeue(session, job_id, [PAUSED], note=None)
        session.commit()
    assert moved(db, job_id, STARTING, [QUEUED], worker="w2") and moved(db, job_id, RUNNING, [STARTING])
    with Session(get_engine(db.database)) as session:
        record_resume(session, job_id, [8, 8])
        session.commit()
    assert moved(db, job_id, SUCCEEDED, [RUNNING])
    with Session(get_engine(db.database)) as session:
        attempts = [(a.number, a.worker, a.outcome, a.reason, a.resumed_from) for a in attempts_of(session, job_id)]
    assert attempts == [(1, "w1", PAUSED, "user_paused", [0, 0]), (2, "w2", SUCCEEDED, None, [8, 8])]


def test_a_requeue_after_a_fault_records_why_on_the_attempt_and_counts_the_restart(db: Settings) -> None:
    job_id = insert_job(db).id
    assert job_id is not None
    assert moved(db, job_id, STARTING, [QUEUED], worker="w1") and moved(db, job_id, RUNNING, [STARTING])
    with Session(get_engine(db.database)) as session:
        assert requeue(session, job_id, [RUNNING], "worker_lost", restarts=1)
        session.commit()
    job = stored(db, job_id)
    assert job.state == QUEUED and job.restarts == 1
    with Session(get_engine(db.database)) as session:
        (attempt,) = attempts_of(session, job_id)
    assert (attempt.outcome, attempt.reason) == ("requeued", "worker_lost") and attempt.ended_at is not None
    with Session(get_engine(db.database)) as session, pytest.raises(ValueError, match="unknown termination_reason"):
        requeue(session, job_id, [FAILED], "bad luck")


def test_failed_and_cancelled_jobs_resume_but_a_cancelling_one_is_never_requeued(db: Settings) -> None:
    failed, cancelled = insert_job(db, state=FAILED).id, insert_job(db, state=CANCELLED).id
    cancelling, succeeded = insert_job(db, state=CANCELLING).id, insert_job(db, state=SUCCEEDED).id
    with Session(get_engine(db.database)) as session:
        assert requeue(session, failed, [FAILED], None)  # type: ignore[arg-type]
        assert requeue(session, cancelled, [CANCELLED], None)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="from 'cancelling' to 'queued'"):
            requeue(session, cancelling, [CANCELLING], "worker_lost")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="from 'succeeded' to 'queued'"):
            requeue(session, succeeded, [SUCCEEDED], None)  # type: ignore[arg-type]
        session.commit()
    assert [stored(db, j).state for j in (failed, cancelled, cancelling, succeeded)] == [  # type: ignore[arg-type]
        QUEUED,
        QUEUED,
        CANCELLING,
        SUCCEEDED,
    ]


def race(settings: Settings, job_id: int, moves: dict[str, Callable[[Session], bool]]) -> dict[str, bool]:
    """Run every move at once, each on its own connection; which of them changed the job."""
    barrier = threading.Barrier(len(moves))
    won: dict[str, bool] = {}

    def run(name: str, move: Callable[[Session], bool]) -> None:
        with Session(get_engine(settings.database)) as session:
            barrier.wait()
            won[name] = move(session)
            session.commit()

    threads = [threading.Thread(target=run, args=item) for item in moves.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return won


@pytest.mark.parametrize("repeat", range(3))
def test_pause_cancel_and_finishing_race_to_one_consistent_end(db: Settings, repeat: int) -> None:
    job_id = insert_job(db).id
    assert job_id is not None
    assert moved(db, job_id, STARTING, [QUEUED], worker="w1") and moved(db, job_id, RUNNING, [STARTING])
    won = race(
        db,
        job_id,
        {
            "pause": lambda session: request_pause(session, job_id),
            "cancel": lambda session: request_cancel(session, job_id),
            "finish": lambda session: transition(session, job_id, SUCCEEDED, [RUNNING, PAUSING, CANCELLING]),
        },
    )
    state = stored(db, job_id).state
    # from running only one move wins; a cancel may still follow a pause (cancelling), and a job that ends
    # ends whatever was asked; the worker then takes `pausing` to paused and `cancelling` to cancelled
    assert won["finish"] == (state == SUCCEEDED)
    assert state in {SUCCEEDED, PAUSING, CANCELLING}
    if state == PAUSING:
        assert won["pause"] and not won["cancel"] and not won["finish"]
    if state == CANCELLING:
        assert won["cancel"]
    with Session(get_engine(db.database)) as session:
        (attempt,) = attempts_of(session, job_id)
    assert (attempt.outcome == SUCCEEDED) == (state == SUCCEEDED)  # closed exactly when it left the worker
