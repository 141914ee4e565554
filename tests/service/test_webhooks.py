"""Service tier: webhooks against a real receiver on loopback (SQLite and PostgreSQL): the API (the secret
never shown, bad fields named), signed deliveries of exactly the chosen events, retries with back-off
after 500s and a timeout until a success or the last attempt, the delivery log in the API and on the
dashboard, and a job that runs unaffected while its receiver is down (a real worker)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.core.database import session_scope
from app.core.deliveries import deliver_due, new_client
from app.core.lifecycle import request_cancel, settle, transition
from app.core.settings import Settings
from app.core.states import QUEUED, RUNNING, STARTING
from pipebd_core.documents.webhook import WebhookPayload
from pipebd_core.job.phases import new_records
from pipebd_core.rundir import RunDir
from tests.helpers import tiny_document
from tests.service.conftest import Embedded, make_settings
from tests.service.factories import queued_job, tiny_job
from tests.service.receiver import Receiver, start_receiver
from tests.service.workers import wait_for
from worker.launcher import JobRunner, JobWatcher

SECRET = "receiver-secret-0123456789"
HOOKS = "/api/v1/webhooks"


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    """Short timeouts and back-off; the app's own delivery loop never wakes (these tests drive each round)."""
    return make_settings(
        tmp_path,
        database_url,
        webhook_timeout_s=0.5,
        webhook_backoff_s=1.0,
        webhook_max_attempts=4,
        webhook_poll_s=3600.0,
    )


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = start_receiver()
    yield found
    found.stop()


def add_hook(client: TestClient, url: str, events: list[str], **fields: Any) -> int:
    answer = client.post(HOOKS, json={"url": url, "events": events, "secret": SECRET, **fields})
    assert answer.status_code == 201, answer.text
    hook_id: int = answer.json()["id"]
    return hook_id


def deliveries(client: TestClient, hook_id: int, **query: str) -> list[dict[str, Any]]:
    answer = client.get(f"{HOOKS}/{hook_id}/deliveries", params=query)
    assert answer.status_code == 200, answer.text
    data: list[dict[str, Any]] = answer.json()["data"]
    return data


def test_a_hook_is_created_read_and_deleted_and_its_secret_is_never_shown(client: TestClient) -> None:
    base = {"url": "https://hooks.example.com/pipebd", "events": ["job.succeeded", "job.failed"], "secret": SECRET}
    created = client.post(HOOKS, json={**base, "description": "team chat"})
    assert created.status_code == 201, created.text
    hook = created.json()
    assert created.headers["location"] == f"{HOOKS}/{hook['id']}"
    assert hook["scope"] == "server" and hook["job_id"] is None and hook["description"] == "team chat"
    assert hook["deliveries"] == {"pending": 0, "succeeded": 0, "failed": 0}
    for answer in (created, client.get(HOOKS), client.get(f"{HOOKS}/{hook['id']}")):
        assert answer.status_code in (200, 201)
        assert SECRET not in answer.text and "secret" not in answer.text
    assert [entry["id"] for entry in client.get(HOOKS).json()["data"]] == [hook["id"]]

    refused = {  # field -> (what is sent instead, words the problem must say)
        "url": ({"url": "ftp://hooks.example.com/x"}, "http:// or https://"),
        "events": ({"events": ["job.done"]}, "unknown event 'job.done'"),
        "secret": ({"secret": "short"}, "at least 16"),
        "job_id": ({"scope": "job", "job_id": 999}, "job 999 does not exist"),
        "scope": ({"scope": "token"}, "this server has no tokens"),
    }
    for field, (change, words) in refused.items():
        answer = client.post(HOOKS, json={**base, **change})
        assert answer.status_code == 422, (field, answer.text)
        problem = answer.json()
        assert problem["errors"][0]["loc"][:2] == ["body", field], problem
        assert words in problem["errors"][0]["message"], problem
    missing_job = client.post(HOOKS, json={**base, "scope": "job"}).json()
    assert "scope `job` needs `job_id`" in missing_job["detail"]
    assert count_rows_of_hooks(client) == 1  # nothing refused was stored

    too_large = client.get(f"{HOOKS}/{2**63}")
    assert too_large.status_code == 422 and too_large.json()["errors"][0]["loc"] == ["path", "webhook_id"]
    foreign = client.get(f"{HOOKS}/{hook['id']}/deliveries", params={"cursor": "am9iOjU"})  # a jobs list's cursor
    assert foreign.status_code == 422 and foreign.json()["errors"][0]["loc"] == ["query", "cursor"]
    assert client.delete(f"{HOOKS}/{hook['id']}").status_code == 204
    assert client.get(f"{HOOKS}/{hook['id']}").status_code == 404
    assert client.delete(f"{HOOKS}/{hook['id']}").status_code == 404


def count_rows_of_hooks(client: TestClient) -> int:
    return len(client.get(HOOKS).json()["data"])


def run_to_success(settings: Settings, job_id: int) -> None:
    """Job `job_id` through its lifecycle as a worker moves it: claimed, running, two phases ended (stored by
    the worker's own watcher), succeeded."""
    with session_scope(settings.database) as session:
        assert transition(session, job_id, STARTING, [QUEUED], worker="test")
    with session_scope(settings.database) as session:
        assert transition(session, job_id, RUNNING, [STARTING])
    runner = JobRunner(job_id, settings, threading.Event())
    watcher = JobWatcher(runner, RunDir(settings.runs / f"job-{job_id}"), 1)
    records = new_records(watcher.run_dir, ["plan", "distill"])
    for record in records:
        record.start()
        watcher.phases_changed(records)
        record.end("succeeded")
        watcher.phases_changed(records)
    watcher.phases_changed(records)  # nothing ended since: no new delivery
    with session_scope(settings.database) as session:
        assert settle(session, job_id, "succeeded", None, server_max_restarts=0) is not None


def test_deliveries_are_signed_and_carry_exactly_the_chosen_events(
    client: TestClient, settings: Settings, receiver: Receiver
) -> None:
    chosen = queued_job(settings, tiny_job("chosen"))
    server_hook = add_hook(client, receiver.script("/server"), ["job.succeeded", "phase.finished"])
    job_hook = add_hook(client, receiver.script("/job"), ["job.running"], scope="job", job_id=chosen)
    other = queued_job(settings, tiny_job("other"))  # its job.queued and job.cancelled: chosen by no hook
    run_to_success(settings, chosen)
    with session_scope(settings.database) as session:
        assert request_cancel(session, other)
    with new_client() as http:
        assert deliver_due(settings, http) == ["succeeded"] * 4

    server = [request.json() for request in receiver.on("/server")]
    assert [(body["event"], (body["phase"] or {}).get("name")) for body in server] == [
        ("phase.finished", "plan"),
        ("phase.finished", "distill"),
        ("job.succeeded", None),
    ]
    assert [request.json()["event"] for request in receiver.on("/job")] == ["job.running"]
    for request in receiver.received:
        assert request.signed_with(SECRET)
        assert not request.signed_with(SECRET + "x")
        body = WebhookPayload.from_json(request.json())
        assert request.headers["x-pipebd-event"] == body.event
        assert request.headers["content-type"] == "application/json"
        assert body.job is not None and body.job.id == chosen and body.job.name == "chosen"
    assert server[-1]["text"] == f"PipeBD job {chosen} (chosen): succeeded"
    assert server[0]["text"].startswith(f"PipeBD job {chosen} (chosen): phase plan succeeded in ")
    assert server[-1]["job"]["state"] == "succeeded" and server[-1]["job"]["progress"] == 1.0

    assert client.delete(f"/api/v1/jobs/{chosen}").status_code == 204  # the job's own hook goes with it
    assert client.get(f"{HOOKS}/{job_hook}").status_code == 404
    assert [entry["event"] for entry in deliveries(client, server_hook)] == ["job.succeeded", *["phase.finished"] * 2]


def test_a_delivery_is_retried_with_back_off_after_500s_and_a_timeout_until_it_succeeds_or_runs_out(
    client: TestClient, settings: Settings, receiver: Receiver
) -> None:
    receiver.slow_s = 1.5  # past the 0.5 s timeout
    flaky = add_hook(client, receiver.script("/flaky", 500, 500, "slow", 200), ["job.cancelled"])
    down = add_hook(client, receiver.script("/down", 500, 500, 500, 500, 500), ["job.cancelled"])
    job_id = queued_job(settings)
    assert client.post(f"/api/v1/jobs/{job_id}/cancel").json()["state"] == "cancelled"
    start = time.time()
    with new_client() as http:

        def round_at(offset: float) -> list[str]:
            return sorted(deliver_due(settings, http, now=start + offset))

        assert round_at(0) == ["pending", "pending"]  # both answered 500
        assert round_at(0.9) == []  # back-off: 1 s after the first attempt
        assert round_at(1.01) == ["pending", "pending"]  # 500 again
        assert round_at(2.9) == []  # the back-off doubled: 2 s
        assert round_at(3.02) == ["pending", "pending"]  # flaky: no answer within 0.5 s; down: 500
        (entry,) = deliveries(client, flaky)
        assert entry["attempts"] == 3 and entry["state"] == "pending" and entry["last_status"] is None
        assert entry["last_error"] == "no answer within 0.5 s (PIPEBD_WEBHOOK_TIMEOUT_S)"
        assert round_at(6.9) == []  # 4 s
        assert round_at(7.03) == ["failed", "succeeded"]  # flaky answered 200; down used its 4 attempts
        assert round_at(1000) == []  # nothing is ever sent again

    (succeeded,) = deliveries(client, flaky)
    assert succeeded["state"] == "succeeded" and succeeded["attempts"] == 4 and succeeded["max_attempts"] == 4
    assert succeeded["last_status"] == 200 and succeeded["last_error"] is None and succeeded["finished_at"]
    (failed,) = deliveries(client, down, state="failed")
    assert failed["attempts"] == 4 and failed["last_status"] == 500 and failed["next_attempt_at"] is None
    assert failed["last_error"] == "HTTP 500: scripted answer"
    assert deliveries(client, down, state="pending") == []
    for path in ("/flaky", "/down"):
        requests = receiver.on(path)
        assert len(requests) == 4 and all(request.signed_with(SECRET) for request in requests)
        assert len({request.headers["x-pipebd-delivery"] for request in requests}) == 1  # one delivery, 4 tries
    assert client.get(f"/api/v1/jobs/{job_id}").json()["state"] == "cancelled"
    assert client.get(f"{HOOKS}/{down}").json()["deliveries"] == {"pending": 0, "succeeded": 0, "failed": 1}

    page = client.get(f"/webhooks/{down}")  # the dashboard's delivery log
    assert page.status_code == 200
    assert "HTTP 500: scripted answer" in page.text and "job.cancelled" in page.text and "failed" in page.text
    listing = client.get("/webhooks").text
    assert receiver.url + "/flaky" in listing and receiver.url + "/down" in listing
    assert SECRET not in listing and SECRET not in page.text


def unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_a_job_runs_unaffected_while_its_receiver_is_down(embedded: Embedded) -> None:
    """A real worker runs a 1-rank job while one hook's receiver refuses every connection; the API's
    background loop sends the other hook each phase's end and the job's success, and records the failures."""
    receiver = start_receiver()
    client = embedded.client
    down = add_hook(client, f"http://127.0.0.1:{unused_port()}/hook", ["job.running", "job.succeeded"])
    up = add_hook(client, receiver.script("/up"), ["phase.finished", "job.succeeded"])
    try:
        document = tiny_document(schedule={"nproc": 1, "profile": False}, train={"epochs": 1})
        job_id = client.post("/api/v1/jobs", json={**document, "name": "unaffected"}).json()["id"]
        job = embedded.wait_state(job_id, {"succeeded", "failed"}, timeout=300)
        assert job["state"] == "succeeded" and job["termination_reason"] is None

        def all_sent() -> list[dict[str, Any]]:
            bodies = [request.json() for request in receiver.on("/up") if request.json()["job"]["id"] == job_id]
            return bodies if len(bodies) == 4 else []

        sent = wait_for(all_sent, 30, "the phases' ends and the job's success at the receiver")
        # four senders deliver side by side: the receiver may hear them in any order
        assert sorted((body["event"], (body["phase"] or {}).get("name") or "") for body in sent) == [
            ("job.succeeded", ""),
            ("phase.finished", "distill"),
            ("phase.finished", "finalize"),
            ("phase.finished", "plan"),
        ]
        tried = wait_for(lambda: [d for d in deliveries(client, down) if d["attempts"]], 30, "attempts to a down host")
        assert all(entry["state"] != "succeeded" and "ConnectError" in entry["last_error"] for entry in tried)
    finally:
        for hook_id in (down, up):
            client.delete(f"{HOOKS}/{hook_id}")
        receiver.stop()
