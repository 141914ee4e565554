"""Service tier: the REST API on a real database (SQLite and PostgreSQL) with a real SQLite broker.

No worker runs here: jobs stay queued unless a test moves them, so every read path is checked
against known rows. Status codes, fields and the problem bodies' `detail` are asserted.
"""

from __future__ import annotations

import yaml
from fastapi.testclient import TestClient

from app.core.priority import next_queued
from app.core.settings import Settings
from app.core.states import FAILED, QUEUED, RUNNING, STARTING
from app.core.tables import Job, JobEvent
from tests.service.factories import broker_messages, count_rows, insert_job, insert_metrics, tiny_job

JOBS = "/api/v1/jobs"


def test_submit_json_is_stored_queued_and_enqueued(client: TestClient, settings: Settings) -> None:
    response = client.post(JOBS, json=tiny_job())
    assert response.status_code == 202
    job = response.json()
    assert response.headers["location"] == f"{JOBS}/{job['id']}"
    assert job["state"] == QUEUED and job["nproc"] == 2 and job["queue"] == "pipebd.ranks-2"
    assert job["spec"]["schedule"]["profile"] is False and job["spec"]["train"]["lr"] == 0.05  # defaults resolved
    assert job["created_at"].endswith("Z") and job["finished_at"] is None
    assert broker_messages(settings) == 1
    detail = client.get(response.headers["location"]).json()
    assert detail["id"] == job["id"] and detail["state"] == QUEUED
    assert detail["waiting_reason"].startswith("no worker is connected")


def test_submit_yaml_with_its_content_type(client: TestClient) -> None:
    body = yaml.safe_dump(tiny_job(name="from-yaml"))
    response = client.post(JOBS, content=body, headers={"Content-Type": "application/yaml"})
    assert response.status_code == 202
    assert response.json()["name"] == "from-yaml"


def test_idempotency_key_returns_the_original_job(client: TestClient, settings: Settings) -> None:
    key = {"Idempotency-Key": "abc-123"}
    first = client.post(JOBS, json=tiny_job(), headers=key)
    # the same spec written differently (YAML, one default spelt out) is the same body
    same = tiny_job(train={"epochs": 1, "lr": 0.05})
    again = client.post(JOBS, content=yaml.safe_dump(same), headers={**key, "Content-Type": "application/yaml"})
    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"] and again.headers["idempotent-replayed"] == "true"
    other = client.post(JOBS, json=tiny_job(train={"epochs": 2}), headers=key)
    assert other.status_code == 422
    assert "abc-123" in other.json()["detail"] and "different spec" in other.json()["detail"]
    assert count_rows(settings, Job) == 1 and broker_messages(settings) == 1


def test_list_is_newest_first_in_cursor_pages(client: TestClient, settings: Settings) -> None:
    ids = [insert_job(settings).id for _ in range(7)]
    insert_job(settings, state=FAILED)
    seen: list[int] = []
    cursor = None
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = client.get(JOBS, params={**params, "state": QUEUED}).json()
        seen += [job["id"] for job in page["data"]]
        assert len(page["data"]) <= 3 and all(job["state"] == QUEUED for job in page["data"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(ids, reverse=True)
    assert "spec" not in client.get(JOBS).json()["data"][0]


def test_list_refuses_bad_parameters(client: TestClient) -> None:
    assert client.get(JOBS, params={"limit": 5000}).json()["detail"].startswith("limit: at most 200")
    assert client.get(JOBS, params={"limit": 0}).status_code == 422
    bad_state = client.get(JOBS, params={"state": "done"})
    assert bad_state.status_code == 422 and "'queued', 'starting', 'running'" in bad_state.json()["detail"]
    bad_cursor = client.get(JOBS, params={"cursor": "nonsense"})
    assert bad_cursor.status_code == 422 and "was not returned by this API" in bad_cursor.json()["detail"]


def test_cancel_is_idempotent_and_delete_needs_a_finished_job(client: TestClient, settings: Settings) -> None:
    job_id = client.post(JOBS, json=tiny_job()).json()["id"]
    conflict = client.delete(f"{JOBS}/{job_id}")
    assert conflict.status_code == 409 and "cancel it" in conflict.json()["detail"]
    for _ in range(2):
        cancelled = client.post(f"{JOBS}/{job_id}/cancel")
        assert cancelled.status_code == 200
        assert cancelled.json()["state"] == "cancelled" and cancelled.json()["termination_reason"] == "user_cancelled"
    states = [event["data"]["state"] for event in events_of(client, job_id)]
    assert states == ["queued", "cancelled"]
    assert client.delete(f"{JOBS}/{job_id}").status_code == 204
    assert client.get(f"{JOBS}/{job_id}").status_code == 404
    assert count_rows(settings, JobEvent) == 0
    assert client.post(JOBS, json=tiny_job()).json()["id"] > job_id  # ids are never reused


def test_cancel_of_a_running_job_asks_its_worker(client: TestClient, settings: Settings) -> None:
    for state in (STARTING, RUNNING):
        job = insert_job(settings, state=state)
        response = client.post(f"{JOBS}/{job.id}/cancel")
        assert response.json()["state"] == "cancelling" and response.json()["termination_reason"] is None


def test_metrics_are_downsampled_keeping_each_buckets_extremes(client: TestClient, settings: Settings) -> None:
    job = insert_job(settings, state=RUNNING)
    assert job.id is not None
    losses = [1.0, 0.9, 5.0, 0.8, 0.7, 0.6, 0.01, 0.5]
    insert_metrics(settings, job.id, rank=0, losses=losses)
    insert_metrics(settings, job.id, rank=1, losses=[2.0, 1.0])
    full = client.get(f"{JOBS}/{job.id}/metrics").json()
    assert full["total"] == 10 and not full["downsampled"]
    assert [p["loss"]["0"] for p in full["points"] if p["rank"] == 0] == losses
    small = client.get(f"{JOBS}/{job.id}/metrics", params={"rank": 0, "max_points": 2}).json()
    assert small["downsampled"] and [p["count"] for p in small["points"]] == [4, 4]
    assert [p["loss_max"]["0"] for p in small["points"]] == [5.0, 0.7]
    assert [p["loss_min"]["0"] for p in small["points"]] == [0.8, 0.01]
    assert small["points"][1]["peak_mem"] == 1008
    later = client.get(f"{JOBS}/{job.id}/metrics", params={"rank": 0, "since_step": 6}).json()
    assert [p["step"] for p in later["points"]] == [6, 7]
    assert client.get(f"{JOBS}/{job.id}/metrics", params={"rank": 2}).status_code == 422
    csv = client.get(f"{JOBS}/{job.id}/artifacts/metrics.csv")
    assert csv.status_code == 200 and csv.text.splitlines()[0].startswith("rank,seq,epoch,step,time,loss_0,data")
    assert csv.text.splitlines()[0].endswith(",samples,peak_mem,cur_mem,gpu_util")
    assert len(csv.text.splitlines()) == 11


def test_files_of_a_job_before_it_runs(client: TestClient, settings: Settings) -> None:
    job = insert_job(settings)
    plan = client.get(f"{JOBS}/{job.id}/plan")
    assert plan.status_code == 404 and "no plan yet" in plan.json()["detail"]
    assert "no logs yet" in client.get(f"{JOBS}/{job.id}/logs").json()["detail"]
    assert client.get(f"{JOBS}/{job.id}/artifacts").json()["data"] == []
    missing = client.get(f"{JOBS}/{job.id}/artifacts/student.pt")
    assert missing.status_code == 404 and "student.pt" in missing.json()["detail"]
    assert client.get(f"{JOBS}/999999").json()["detail"] == "job 999999 does not exist (it may have been deleted)"


def test_health_and_prometheus_metrics(client: TestClient, settings: Settings) -> None:
    health = client.get("/healthz")
    assert health.status_code == 200 and health.json() == {"status": "ok", "database": "ok", "broker": "ok"}
    insert_job(settings, state=RUNNING, samples_per_s=12.5, progress=0.25)
    client.post(JOBS, json=tiny_job())
    text = client.get("/metrics").text
    assert 'pipebd_jobs{state="running"} 1.0' in text and 'pipebd_jobs{state="queued"} 1.0' in text
    assert 'pipebd_queue_depth{queue="pipebd.ranks-2"} 1.0' in text
    assert 'pipebd_job_samples_per_second{job_id="1",name="tiny"} 12.5' in text


def test_health_names_an_unreachable_broker(tmp_path, database_url: str) -> None:  # type: ignore[no-untyped-def]
    from app.main import create_app
    from tests.service.conftest import make_settings

    settings = make_settings(tmp_path, database_url, broker_url="redis://127.0.0.1:1/0")
    with TestClient(create_app(settings)) as client:
        health = client.get("/healthz")
        assert health.status_code == 503 and health.json()["detail"].startswith("the broker is unreachable: ")
        assert "database" not in health.json()["detail"]  # it answers: only the broker is named
        refused = client.post(JOBS, json=tiny_job())
        assert refused.status_code == 503 and "nothing was stored" in refused.json()["detail"]
    assert count_rows(settings, Job) == 0 and count_rows(settings, JobEvent) == 0


def test_openapi_documents_the_api(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path in (
        "/api/v1/jobs",
        "/api/v1/jobs/{job_id}",
        "/api/v1/jobs/{job_id}/events",
        "/api/v1/jobs/{job_id}/metrics",
        "/api/v1/jobs/{job_id}/logs",
        "/api/v1/jobs/{job_id}/artifacts/{name}",
        "/healthz",
    ):
        assert path in paths


def events_of(client: TestClient, job_id: int) -> list[dict]:  # type: ignore[type-arg]
    from tests.service.sse import read_events

    return [event for event in read_events(client.get(f"{JOBS}/{job_id}/events").text) if event["event"] != "end"]


def test_patch_changes_a_queued_jobs_priority_and_its_place(client: TestClient, settings: Settings) -> None:
    first, second = (client.post(JOBS, json=tiny_job(name=name)).json()["id"] for name in ("first", "second"))
    assert client.get(f"{JOBS}/{second}").json()["queue_position"] == 1  # jobs ahead of it
    changed = client.patch(f"{JOBS}/{second}", json={"priority": 5})
    assert changed.status_code == 200 and changed.json()["priority"] == 5
    assert changed.json()["queue_position"] == 0 and client.get(f"{JOBS}/{first}").json()["queue_position"] == 1
    assert next_queued(settings.database, devices=2) == second
    for body in ({"priority": "high"}, {"priority": 5000}, {"priority": 1, "nproc": 4}, {}):
        assert client.patch(f"{JOBS}/{first}", json=body).status_code == 422, body
    running = insert_job(settings, state=RUNNING)
    refused = client.patch(f"{JOBS}/{running.id}", json={"priority": 9})
    assert refused.status_code == 409 and "the job is running: only a queued job" in refused.json()["detail"]
    assert client.get(f"{JOBS}/{running.id}").json()["priority"] == 0
    assert client.patch(f"{JOBS}/999999", json={"priority": 1}).status_code == 404
