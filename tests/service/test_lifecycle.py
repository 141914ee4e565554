"""Service tier: the lifecycle's allowed-moves table and its compare-and-set on real databases.

Concurrent claims race through real connections (SQLite and PostgreSQL): exactly one wins.
"""

from __future__ import annotations

import threading

import pytest
from sqlmodel import Session, select

from app.core.database import get_engine, migrate
from app.core.lifecycle import ALLOWED_MOVES, TransitionError, check_move, request_cancel, transition
from app.core.settings import Settings
from app.core.states import CANCELLED, CANCELLING, FAILED, FINAL, PAUSED, QUEUED, RUNNING, STARTING, STATES, SUCCEEDED
from app.core.tables import Job, JobEvent
from tests.service.factories import insert_job


@pytest.fixture
def db(settings: Settings) -> Settings:
    migrate(settings.database)
    return settings


def state_of(settings: Settings, job_id: int) -> str:
    with Session(get_engine(settings.database)) as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job.state


def test_the_table_has_the_documented_shape() -> None:
    assert set(ALLOWED_MOVES) == set(STATES)
    assert not ALLOWED_MOVES[SUCCEEDED]
    assert all(ALLOWED_MOVES[state] == {QUEUED} for state in FINAL - {SUCCEEDED})  # resumed, nothing else
    assert ALLOWED_MOVES[QUEUED] == {STARTING, CANCELLED, FAILED, PAUSED}
    assert ALLOWED_MOVES[PAUSED] == {QUEUED, CANCELLED}
    assert SUCCEEDED in ALLOWED_MOVES[RUNNING] and QUEUED in ALLOWED_MOVES[RUNNING]  # requeued after a fault
    assert QUEUED not in ALLOWED_MOVES[CANCELLING]  # a cancel is never undone by a restart
    with pytest.raises(TransitionError, match="from 'succeeded' to 'running'; from 'succeeded' it may move to nothing"):
        check_move(SUCCEEDED, RUNNING)
    with pytest.raises(TransitionError, match="may move to cancelled, failed, paused, starting"):
        check_move(QUEUED, SUCCEEDED)
    with pytest.raises(TransitionError, match="from 'failed' to 'running'; from 'failed' it may move to queued"):
        check_move(FAILED, RUNNING)


def test_transition_is_compare_and_set_and_records_an_event(db: Settings) -> None:
    job = insert_job(db)
    assert job.id is not None
    with Session(get_engine(db.database)) as session:
        assert transition(session, job.id, STARTING, [QUEUED], worker="w1")
        assert not transition(session, job.id, STARTING, [QUEUED], worker="w2")  # already claimed
        assert transition(session, job.id, RUNNING, [STARTING])
        assert transition(session, job.id, FAILED, [RUNNING], termination_reason="rank_error", error="boom")
        for target in (RUNNING, CANCELLED):  # a failed job only goes back to the queue
            with pytest.raises(TransitionError):
                transition(session, job.id, target, [FAILED])
        session.commit()
        events = session.exec(select(JobEvent).where(JobEvent.job_id == job.id).order_by(JobEvent.id)).all()  # type: ignore[arg-type]
        stored = session.get(Job, job.id)
        assert stored is not None
    assert [event.data["state"] for event in events] == [STARTING, RUNNING, FAILED]
    assert stored.worker == "w1" and stored.error == "boom" and stored.finished_at is not None
    with (
        pytest.raises(TransitionError, match="unknown termination_reason"),
        Session(get_engine(db.database)) as session,
    ):
        transition(session, job.id, FAILED, [RUNNING], termination_reason="bad luck")


def test_only_one_of_many_concurrent_claims_wins(db: Settings) -> None:
    job = insert_job(db)
    assert job.id is not None
    job_id = job.id
    barrier = threading.Barrier(6)
    wins: list[str] = []

    def claim(name: str) -> None:
        with Session(get_engine(db.database)) as session:
            barrier.wait()
            if transition(session, job_id, STARTING, [QUEUED], worker=name):
                wins.append(name)
            session.commit()

    threads = [threading.Thread(target=claim, args=(f"w{i}",)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(wins) == 1
    with Session(get_engine(db.database)) as session:
        stored = session.get(Job, job_id)
        assert stored is not None and stored.worker == wins[0]


def test_cancel_moves_by_state(db: Settings) -> None:
    queued, running, done = insert_job(db), insert_job(db, state=RUNNING), insert_job(db, state=SUCCEEDED)
    with Session(get_engine(db.database)) as session:
        assert request_cancel(session, queued.id)  # type: ignore[arg-type]
        assert request_cancel(session, running.id)  # type: ignore[arg-type]
        assert not request_cancel(session, running.id)  # type: ignore[arg-type]  # already cancelling
        assert not request_cancel(session, done.id)  # type: ignore[arg-type]
        session.commit()
    assert [state_of(db, job.id) for job in (queued, running, done)] == [CANCELLED, CANCELLING, SUCCEEDED]  # type: ignore[arg-type]
