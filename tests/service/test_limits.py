"""Service tier: admission limits kept in the database hold across threads and across API processes: the
queue's capacity is never exceeded, and a client's submissions are counted once, whichever process got them."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import Session, col, select

from app.core.database import get_engine, migrate
from app.core.limits import WINDOW_S, count_submission, forget_quiet, rate_name, take
from app.core.settings import Settings
from app.core.tables import Job, LimitState
from app.services.jobs import QueueFull, create_job
from pipebd_core.spec import parse_spec
from tests.service.conftest import make_settings
from tests.service.factories import tiny_job
from tests.service.live import pipebd_api

JOBS = "/api/v1/jobs"


def rate_rows(settings: Settings) -> dict[str, list[float]]:
    """The clients' rate rows (not the queue's or the gangs' lock rows, which the API's reaper also holds)."""
    with Session(get_engine(settings.database)) as session:
        rows = session.exec(select(LimitState).where(col(LimitState.name).startswith(rate_name("")))).all()
        return {row.name: row.times for row in rows}


def test_a_clients_rate_is_taken_once_by_concurrent_requests(settings: Settings) -> None:
    """16 threads, each with its own connection, submit at once: exactly `per_minute` are admitted."""
    migrate(settings.database)
    with ThreadPoolExecutor(16) as pool:
        waits = list(pool.map(lambda _: count_submission(settings.database, "address:10.0.0.1", 5), range(16)))
    assert waits.count(None) == 5
    assert all(wait is not None and WINDOW_S - 5 < wait <= WINDOW_S for wait in waits if wait is not None)
    assert len(rate_rows(settings)[rate_name("address:10.0.0.1")]) == 5
    assert count_submission(settings.database, "address:10.0.0.2", 5) is None  # another client: its own count


def test_uses_leave_the_window_and_quiet_clients_are_forgotten(settings: Settings) -> None:
    migrate(settings.database)
    with Session(get_engine(settings.database)) as session:
        assert [take(session, "rate:a", limit=2, window_s=60, at=at) for at in (100.0, 110.0, 120.0)] == [
            None,
            None,
            40.0,  # the use at 100 leaves the window at 160
        ]
        assert take(session, "rate:a", limit=2, window_s=60, at=161.0) is None  # 110 and 161 are in it now
        assert take(session, "rate:b", limit=2, window_s=60, at=100.0) is None
        # a time read before the lock was waited for, older than a use counted meanwhile: measured from that use
        assert take(session, "rate:c", limit=1, window_s=60, at=130.0) is None
        assert take(session, "rate:c", limit=1, window_s=60, at=129.5) == 60.0
        session.commit()
        forget_quiet(session, before=150.0)
        session.commit()
    assert set(rate_rows(settings)) == {"rate:a"}  # b and c were last seen at 100 and 130


def test_concurrent_submissions_never_pass_the_queue_cap(settings: Settings) -> None:
    """12 threads store a job at once, each in its own transaction, with room for 3: exactly 3 are stored."""
    migrate(settings.database)
    spec = parse_spec(tiny_job())

    def store(index: int) -> str:
        with Session(get_engine(settings.database)) as session:
            try:
                create_job(session, spec=spec, request_hash=f"{index}", idempotency_key=None, max_queued=3)
            except QueueFull as full:
                return f"full at {full.queued}"
            return "stored"

    with ThreadPoolExecutor(12) as pool:
        outcomes = Counter(pool.map(store, range(12)))
    assert outcomes == {"stored": 3, "full at 3": 9}
    with Session(get_engine(settings.database)) as session:
        assert len(session.exec(select(Job)).all()) == 3


def post_all(requests: list[tuple[str, Any]]) -> list[httpx.Response]:
    """POST each (url, json body) at once, from its own thread."""
    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(lambda request: httpx.post(f"{request[0]}{JOBS}", json=request[1], timeout=120), requests))


@pytest.mark.timeout(300)
def test_two_api_processes_share_the_queue_cap_and_the_rate_limit(
    tmp_path: Path, postgres_url: str, redis_url: str
) -> None:
    """Two `pipebd api` processes on one PostgreSQL database and one Redis broker, as in production, their
    spec checkers warmed by a spec each that the preflight refuses: 8 valid specs at once, 4 to each, with
    room for 2 queued jobs, store exactly 2; then, with 12 submissions a minute allowed and 10 counted, 6
    more at once get exactly 2 through."""
    settings = make_settings(tmp_path, postgres_url, broker_url=redis_url)
    limits = {"PIPEBD_MAX_QUEUED_JOBS": "2", "PIPEBD_SUBMISSIONS_PER_MINUTE": "12", "PIPEBD_SPEC_CHECKERS": "1"}
    with pipebd_api(settings, **limits) as first, pipebd_api(settings, **limits) as second:
        urls = [first.url, second.url]
        refused = tiny_job(schedule={"mode": "hybrid", "stages": [{"start": 0, "stop": 2, "replicas": 1}]})
        assert [answer.status_code for answer in post_all([(url, refused) for url in urls])] == [422, 422]
        answers = post_all([(urls[i % 2], tiny_job(name=f"job-{i}")) for i in range(8)])
        assert Counter(answer.status_code for answer in answers) == {202: 2, 429: 6}, [a.text for a in answers]
        assert all("jobs are queued" in a.json()["detail"] for a in answers if a.status_code == 429)
        with Session(get_engine(settings.database)) as session:
            assert len(session.exec(select(Job)).all()) == 2
        answers = post_all([(urls[i % 2], {}) for i in range(6)])
        assert Counter(answer.status_code for answer in answers) == {422: 2, 429: 4}, [a.text for a in answers]
        assert all("submissions in a minute" in a.json()["detail"] for a in answers if a.status_code == 429)
    assert [len(times) for times in rate_rows(settings).values()] == [12]
