"""Service tier: priorities with the real embedded worker (Celery on the SQLite broker, which has no
message priorities): a free worker takes the highest-priority queued job, the oldest first within a
priority, and a queued job's page says how many jobs run before it."""

from __future__ import annotations

from tests.service.conftest import Embedded
from tests.service.factories import long_job, tiny_job


def test_a_free_worker_takes_the_highest_priority_job_first(embedded: Embedded) -> None:
    client = embedded.client
    blocker = client.post("/api/v1/jobs", json=long_job(name="blocker")).json()["id"]
    embedded.wait_state(blocker, {"running"}, 120)
    low = client.post("/api/v1/jobs", json={**tiny_job("low", schedule={"nproc": 1}), "priority": 0}).json()["id"]
    low_too = client.post("/api/v1/jobs", json={**tiny_job("low-too", schedule={"nproc": 1}), "priority": 0}).json()[
        "id"
    ]
    high = client.post("/api/v1/jobs", json={**tiny_job("high", schedule={"nproc": 1}), "priority": 5}).json()["id"]
    waiting = [client.get(f"/api/v1/jobs/{job_id}").json() for job_id in (low, low_too, high)]
    assert [job["queue_position"] for job in waiting] == [1, 2, 0]
    assert waiting[1]["waiting_reason"].startswith("2 queued jobs with a higher priority or submitted earlier")
    assert waiting[2]["priority"] == 5 and "run first" not in waiting[2]["waiting_reason"]
    client.post(f"/api/v1/jobs/{blocker}/cancel")
    ended = [embedded.wait_state(job_id, {"succeeded", "failed"}, 180) for job_id in (high, low, low_too)]
    assert [job["state"] for job in ended] == ["succeeded"] * 3, [job["error"] for job in ended]
    started = [job["attempts"][0]["started_at"] for job in ended]
    assert started == sorted(started), "high, then the two priority-0 jobs in the order they came"
