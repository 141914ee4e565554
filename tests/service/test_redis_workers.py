"""Service tier, production shape: two real worker processes against the real Redis and PostgreSQL.

Worker "one" advertises 1 device, worker "two" advertises 2. A 2-rank job can only go to "two";
a 1-rank job submitted while "two" is busy runs on "one" at the same time. Then worker "two" is
killed with SIGKILL mid-job: the API's reaper fails the job with `worker_lost` and kills the ranks
the dead worker left behind.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.core.settings import Settings
from app.main import create_app
from tests.service.conftest import make_settings
from tests.service.factories import long_job
from tests.service.workers import WorkerProcess, rank_processes, start_worker, wait_for

JOB_TIMEOUT_S = 180


@pytest.fixture
def cluster(
    tmp_path: Path, postgres_url: str, redis_url: str
) -> Iterator[tuple[TestClient, Settings, dict[str, WorkerProcess]]]:
    settings = make_settings(
        tmp_path,
        postgres_url,
        broker_url=redis_url,
        stale_after_s=3.0,
        reaper_interval_s=0.5,
        heartbeat_s=0.5,
        max_restarts=0,  # a lost job fails here; tests/chaos restarts it
    )
    with TestClient(create_app(settings)) as client:
        workers: dict[str, WorkerProcess] = {}
        try:
            for name, devices in (("one", 1), ("two", 2)):
                workers[name] = start_worker(settings, name, devices)
            yield client, settings, workers
        finally:
            for worker in workers.values():
                worker.stop()


def job(client: TestClient, job_id: int) -> dict[str, Any]:
    result: dict[str, Any] = client.get(f"/api/v1/jobs/{job_id}").json()
    return result


def test_jobs_go_to_workers_with_enough_devices_and_run_at_once(
    cluster: tuple[TestClient, Settings, dict[str, WorkerProcess]],
) -> None:
    client, settings, workers = cluster
    logs = lambda: "\n".join(w.output()[-2000:] for w in workers.values())  # noqa: E731
    big = client.post("/api/v1/jobs", json=long_job(name="big")).json()["id"]
    wait_for(lambda: job(client, big)["state"] == "running", JOB_TIMEOUT_S, "the 2-rank job to run", logs)
    small = client.post("/api/v1/jobs", json=long_job(name="small", schedule={"nproc": 1})).json()["id"]
    wait_for(lambda: job(client, small)["state"] == "running", JOB_TIMEOUT_S, "the 1-rank job to run", logs)
    for job_id in (big, small):  # both are training: their ranks have sent telemetry
        metrics = f"/api/v1/jobs/{job_id}/metrics"
        wait_for(lambda: client.get(metrics).json()["total"] > 0, JOB_TIMEOUT_S, f"telemetry of {job_id}", logs)  # noqa: B023
    both = client.get(f"/api/v1/jobs/{big}").json(), client.get(f"/api/v1/jobs/{small}").json()
    assert [j["state"] for j in both] == ["running", "running"], [(j["termination_reason"], j["error"]) for j in both]
    assert [j["worker"] for j in both] == ["two", "one"]
    text = client.get("/metrics").text
    assert 'pipebd_jobs{state="running"} 2.0' in text and 'pipebd_worker_devices{worker="two"} 2.0' in text

    client.post(f"/api/v1/jobs/{small}/cancel")
    wait_for(lambda: job(client, small)["state"] == "cancelled", 15, "the 1-rank job to be cancelled", logs)

    run_dir = str(settings.runs / f"job-{big}")
    assert rank_processes(run_dir)
    os.kill(workers["two"].process.pid, signal.SIGKILL)  # the worker dies; its torchrun is in its own session
    workers["two"].process.wait()
    lost = wait_for(lambda: job(client, big)["state"] == "failed" and job(client, big), 30, "the reaper", logs)
    assert lost["termination_reason"] == "worker_lost"
    assert "the worker two (pid" in job(client, big)["error"]
    wait_for(lambda: rank_processes(run_dir) == [], 15, "the orphaned ranks to be killed")
