"""Service tier: the SSE stream over real HTTP (uvicorn) on SQLite and PostgreSQL.

State changes are made with the lifecycle functions a worker uses, while a client reads the stream.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import event
from sqlmodel import Session

from app.core.database import get_engine, migrate
from app.core.lifecycle import transition
from app.core.settings import Settings
from app.core.states import FAILED, QUEUED, RUNNING, STARTING
from app.main import create_app
from tests.service.conftest import make_settings
from tests.service.factories import insert_job, insert_metrics
from tests.service.live import serve
from tests.service.sse import read_events


@pytest.fixture
def live(tmp_path: Path, database_url: str) -> Iterator[tuple[str, Settings]]:
    settings = make_settings(tmp_path, database_url, sse_keepalive_s=0.3)
    with serve(create_app(settings)) as url:
        yield url, settings


def move(settings: Settings, job_id: int, target: str, source: str, **fields: object) -> None:
    with Session(get_engine(settings.database)) as session:
        assert transition(session, job_id, target, [source], **fields)
        session.commit()


def test_stream_follows_a_job_to_its_end(live: tuple[str, Settings]) -> None:
    url, settings = live
    job = insert_job(settings)
    assert job.id is not None
    job_id = job.id

    def worker_side() -> None:
        time.sleep(0.8)  # long enough for a keep-alive comment (every 0.3 s) first
        move(settings, job_id, STARTING, QUEUED)
        move(settings, job_id, RUNNING, STARTING)
        insert_metrics(settings, job_id, rank=0, losses=[0.5, 0.4])
        move(settings, job_id, FAILED, RUNNING, termination_reason="rank_error", error="Traceback ...")

    thread = threading.Thread(target=worker_side)
    with httpx.stream("GET", f"{url}/api/v1/jobs/{job_id}/events", timeout=30) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        thread.start()  # once the stream is open, however slowly the server answered on a busy machine
        body = "".join(response.iter_text())
    thread.join()
    events = read_events(body)
    assert {"comment": "keep-alive"} in events
    named = [event for event in events if "event" in event]
    assert [e["event"] for e in named] == ["state", "state", "metrics", "state", "end"]
    assert [e["data"].get("state") for e in named if e["event"] == "state"] == [STARTING, RUNNING, FAILED]
    metrics = named[2]["data"]
    assert [record["loss"]["0"] for record in metrics["records"]] == [0.5, 0.4] and metrics["progress"] == 0.5
    assert named[-1]["id"] is None and named[-1]["data"] == {
        "job_id": job_id,
        "state": FAILED,
        "termination_reason": "rank_error",
    }
    ids = [e["id"] for e in named[:-1]]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_last_event_id_resumes_after_that_event(live: tuple[str, Settings]) -> None:
    url, settings = live
    job = insert_job(settings)
    assert job.id is not None
    for target, source in ((STARTING, QUEUED), (RUNNING, STARTING), (FAILED, RUNNING)):
        move(settings, job.id, target, source, **({"termination_reason": "exit_code"} if target == FAILED else {}))
    everything = read_events(httpx.get(f"{url}/api/v1/jobs/{job.id}/events", timeout=30).text)
    ids = [e["id"] for e in everything if e.get("id") is not None]
    assert len(ids) == 3  # starting, running, failed (the queued event was not written by insert_job)
    resumed = httpx.get(f"{url}/api/v1/jobs/{job.id}/events", headers={"Last-Event-ID": str(ids[0])}, timeout=30)
    assert [e["id"] for e in read_events(resumed.text) if "event" in e] == [*ids[1:], None]
    by_query = httpx.get(f"{url}/api/v1/jobs/{job.id}/events", params={"after": ids[1]}, timeout=30)
    assert [e["event"] for e in read_events(by_query.text) if "event" in e] == ["state", "end"]
    bad = httpx.get(f"{url}/api/v1/jobs/{job.id}/events", headers={"Last-Event-ID": "abc"}, timeout=30)
    assert bad.status_code == 422 and bad.json()["errors"][0]["loc"] == ["header", "last-event-id"]


def test_reaper_fails_jobs_whose_worker_went_silent(tmp_path: Path, database_url: str) -> None:
    settings = make_settings(tmp_path, database_url, stale_after_s=1.0, reaper_interval_s=0.2, max_restarts=0)
    migrate(settings.database)
    job = insert_job(settings, state=RUNNING, heartbeat_at=time.time() - 5, worker="gone", host="elsewhere", pid=1)
    fresh = insert_job(settings, state=RUNNING, heartbeat_at=time.time() + 60)
    # silent, but its worker process is visibly alive on this host: slow, not lost
    slow = insert_job(
        settings,
        state=RUNNING,
        heartbeat_at=time.time() - 5,
        host=socket.gethostname(),
        worker_pid=os.getpid(),
        started_at=time.time(),
    )
    with serve(create_app(settings)) as url:
        deadline = time.time() + 60  # generous: the reaper looks every 0.2 s
        while httpx.get(f"{url}/api/v1/jobs/{job.id}").json()["state"] != FAILED and time.time() < deadline:
            time.sleep(0.1)
        lost = httpx.get(f"{url}/api/v1/jobs/{job.id}").json()
        assert lost["state"] == FAILED and lost["termination_reason"] == "worker_lost"
        assert "the worker gone stopped sending heartbeats" in lost["error"]
        assert httpx.get(f"{url}/api/v1/jobs/{fresh.id}").json()["state"] == RUNNING
        assert httpx.get(f"{url}/api/v1/jobs/{slow.id}").json()["state"] == RUNNING


def test_followers_of_one_job_share_their_queries(tmp_path: Path, database_url: str) -> None:
    """30 clients following one job cost one event read, not 30 (the load test's finding: each
    follower polling on its own took every thread and connection of the API at 100 followers)."""
    # answers stay shared for 60 s: however slowly a loaded machine lets the 30 in, they come within that
    settings = make_settings(tmp_path, database_url, sse_poll_s=120.0)
    migrate(settings.database)
    job = insert_job(settings)
    assert job.id is not None
    insert_metrics(settings, job.id, rank=0, losses=[0.5, 0.4])
    move(settings, job.id, STARTING, QUEUED)
    move(settings, job.id, FAILED, STARTING, termination_reason="launch_error")
    reads: list[str] = []

    def count(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        if "FROM job_event" in statement:
            reads.append(statement)

    event.listen(get_engine(settings.database), "before_cursor_execute", count)
    bodies: list[str] = []
    with serve(create_app(settings)) as url:
        barrier = threading.Barrier(30)

        def follow() -> None:
            barrier.wait()
            bodies.append(httpx.get(f"{url}/api/v1/jobs/{job.id}/events", timeout=60).text)

        threads = [threading.Thread(target=follow) for _ in range(30)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    event.remove(get_engine(settings.database), "before_cursor_execute", count)
    assert len(bodies) == 30 and len(set(bodies)) == 1
    assert [e["event"] for e in read_events(bodies[0]) if "event" in e] == ["metrics", "state", "state", "end"]
    assert len(reads) == 1, reads  # the first follower's read; the other 29 took its answer


def test_open_streams_hold_no_database_connection(tmp_path: Path, database_url: str) -> None:
    """More followers than the connection pool has connections (15), and the API still answers at once."""
    settings = make_settings(tmp_path, database_url)
    migrate(settings.database)
    job = insert_job(settings)  # queued: its streams stay open
    with serve(create_app(settings)) as url, httpx.Client(base_url=url, timeout=30) as client:
        streams = [client.stream("GET", f"/api/v1/jobs/{job.id}/events") for _ in range(20)]
        opened = [stream.__enter__() for stream in streams]
        try:
            for response in opened:
                assert next(response.iter_text()).startswith("retry:")  # each is being served
            # answered while all 20 are open: streams that held connections would leave this request none, and it
            # would end in a 500 once the pool's 30 s wait ran out
            assert client.get("/api/v1/jobs", params={"limit": 5}).status_code == 200
            assert all(not response.is_closed for response in opened)
        finally:
            for stream in streams:
                stream.__exit__(None, None, None)
