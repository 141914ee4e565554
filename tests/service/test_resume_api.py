"""Service tier: POST /api/v1/jobs/{id}/pause and /resume on real databases and the real SQLite broker,
and `pipebd pause` / `pipebd resume` against a served API. A job that cannot resume is refused with 409
and the reason, and nothing changes: not its row, not its events, not the broker; a resume the broker refuses
is answered 503 and shows nothing to anyone meanwhile (no `queued` taken back)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, func, select

from app.cli.main import main
from app.core.database import get_engine, migrate
from app.core.settings import Settings
from app.core.tables import Job, JobEvent
from app.main import create_app
from pipebd_core.rundir import RunDir
from tests.service.conftest import make_settings
from tests.service.factories import broker_messages, insert_job, tiny_job
from tests.service.live import serve


def events_of(settings: Settings, job_id: int) -> int:
    with Session(get_engine(settings.database)) as session:
        return int(session.exec(select(func.count()).select_from(JobEvent).where(JobEvent.job_id == job_id)).one())


def run_dir(settings: Settings, name: str) -> str:
    """A run directory with the file a resume needs (phases.json)."""
    folder = settings.runs / name
    RunDir(folder).save_phases([])
    return str(folder)


def refused(client: TestClient, settings: Settings, job_id: int, action: str) -> str:
    """The 409's detail, after checking that nothing changed."""
    before = client.get(f"/api/v1/jobs/{job_id}").json()
    events, messages = events_of(settings, job_id), broker_messages(settings)
    response = client.post(f"/api/v1/jobs/{job_id}/{action}")
    assert response.status_code == 409, response.text
    assert response.headers["content-type"] == "application/problem+json"
    after = client.get(f"/api/v1/jobs/{job_id}").json()
    assert after == before and events_of(settings, job_id) == events and broker_messages(settings) == messages
    detail: str = response.json()["detail"]
    return detail


def test_resume_is_refused_with_the_reason_and_changes_nothing(client: TestClient, settings: Settings) -> None:
    queued, done = insert_job(settings), insert_job(settings, state="succeeded")
    gone = insert_job(settings, state="failed", termination_reason="worker_lost", run_dir=str(settings.runs / "gone"))
    invalid_spec = tiny_job(train={"epochs": settings.max_epochs + 1})
    stale = insert_job(settings, state="cancelled", spec=invalid_spec, run_dir=run_dir(settings, "stale"))
    assert "is queued; only failed, cancelled or paused jobs resume (it is already queued)" in refused(
        client, settings, queued.id, "resume"
    )
    assert "is succeeded; only failed, cancelled or paused jobs resume" in refused(client, settings, done.id, "resume")
    detail = refused(client, settings, gone.id, "resume")
    assert f"run directory {settings.runs / 'gone'} is gone" in detail and "submit its spec again" in detail
    detail = refused(client, settings, stale.id, "resume")
    assert "spec no longer validates on this server" in detail and "train.epochs" in detail


def test_resume_requeues_a_failed_job_and_publishes_it_once(client: TestClient, settings: Settings) -> None:
    lost = insert_job(
        settings,
        state="failed",
        termination_reason="worker_lost",
        error="gone",
        restarts=2,
        run_dir=run_dir(settings, "r"),
    )
    messages = broker_messages(settings)
    response = client.post(f"/api/v1/jobs/{lost.id}/resume")
    assert response.status_code == 200, response.text
    job: dict[str, Any] = response.json()
    assert (job["state"], job["termination_reason"], job["error"], job["finished_at"]) == ("queued", None, None, None)
    assert job["restarts"] == 0 and job["max_restarts"] == settings.max_restarts and job["queue_position"] == 0
    assert broker_messages(settings) == messages + 1
    assert "only failed, cancelled or paused jobs resume" in refused(client, settings, lost.id, "resume")


def state_and_events(settings: Settings, job_id: int) -> tuple[str | None, int]:
    """The job's state and its number of events, as any other reader (an SSE follower, the UI) sees them."""
    with Session(get_engine(settings.database)) as session:
        job = session.get(Job, job_id)
        return (None if job is None else job.state), events_of(settings, job_id)


@contextmanager
def refusing_broker(on_connect: Callable[[], None]) -> Iterator[str]:
    """A broker address whose server hangs up on every connection (a Redis that went away mid-request), calling
    `on_connect` first: what the rest of the service sees while a publish is being tried."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            on_connect()
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def test_a_resume_the_broker_refuses_is_never_seen_queued(tmp_path: Path, database_url: str) -> None:
    """Found by the soak (issue 42): the resume committed the job `queued` (its event, its webhooks), then the broker
    refused the message and the resume took it all back; an SSE follower had been sent the `queued` event
    meanwhile, an event no longer stored. The message is now published before the requeue commits."""
    seen: list[tuple[str | None, int]] = []
    job_id: list[int] = []
    with refusing_broker(lambda: seen.append(state_and_events(settings, job_id[0]))) as broker:
        settings = make_settings(tmp_path, database_url, broker_url=broker)
        with TestClient(create_app(settings)) as client:
            paused = insert_job(
                settings, state="paused", termination_reason="user_paused", run_dir=run_dir(settings, "p")
            )
            assert paused.id is not None
            job_id.append(paused.id)
            before = state_and_events(settings, paused.id)
            response = client.post(f"/api/v1/jobs/{paused.id}/resume")
    assert response.status_code == 503 and "the broker did not accept the job" in response.json()["detail"]
    assert seen, "the resume never tried the broker"
    assert set(seen) == {before} == {state_and_events(settings, paused.id)}  # while it tried, and after: paused


def test_pause_a_queued_job_then_resume_or_cancel_it(client: TestClient, settings: Settings) -> None:
    first, second = insert_job(settings), insert_job(settings, priority=5)
    assert client.get(f"/api/v1/jobs/{first.id}").json()["queue_position"] == 1  # the priority-5 job runs first
    assert "1 queued job with a higher priority" in client.get(f"/api/v1/jobs/{first.id}").json()["waiting_reason"]
    paused = client.post(f"/api/v1/jobs/{second.id}/pause").json()
    assert paused["state"] == "paused" and paused["termination_reason"] == "user_paused" and paused["attempts"] == []
    assert client.post(f"/api/v1/jobs/{second.id}/pause").json()["state"] == "paused"  # idempotent
    assert client.get(f"/api/v1/jobs/{first.id}").json()["queue_position"] == 0  # a paused job waits for nobody
    assert client.post(f"/api/v1/jobs/{second.id}/resume").json()["state"] == "queued"  # never ran: no run dir
    client.post(f"/api/v1/jobs/{second.id}/pause")
    assert client.post(f"/api/v1/jobs/{second.id}/cancel").json()["state"] == "cancelled"
    done = insert_job(settings, state="succeeded")
    assert "is succeeded; only queued, starting or running jobs can be paused" in refused(
        client, settings, done.id, "pause"
    )
    assert "resume it instead" in refused(client, settings, second.id, "pause")


def test_the_cli_pauses_and_resumes_and_prints_a_refusal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'cli.db'}")
    migrate(settings.database)
    job = insert_job(settings)
    with serve(create_app(settings)) as url:
        assert main(["pause", str(job.id), "--server", url]) == 0
        assert f"pipebd: job {job.id} paused" in capsys.readouterr().out
        assert main(["resume", str(job.id), "--server", url]) == 0
        assert f"pipebd: job {job.id} queued" in capsys.readouterr().out
        assert main(["resume", str(job.id), "--server", url]) != 0
        assert f"resume job {job.id}: HTTP 409: job {job.id} is queued" in capsys.readouterr().err
