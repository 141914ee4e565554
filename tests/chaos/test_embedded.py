"""Chaos tier, the embedded default (`pipebd up`, real API, worker, SQLite database and broker, torchrun):
the worker killed with SIGKILL mid-distillation is started again and the job resumes and succeeds; a
job that may not restart (max_restarts 0) fails `worker_lost` and resumes from the API; a clean
shutdown leaves queued jobs queued and requeues the running one checkpointed, and the next start runs
them all. Every finished job's students equal those of the uninterrupted run (1e-6), its telemetry
holds every step once, and no process of the dead worker is left."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, parse_spec
from tests.chaos.embedded import Up, assert_steps_once
from tests.chaos.jobs import slow_job
from tests.helpers import assert_same_weights, load_students
from tests.service.workers import rank_processes, wait_for

TOLERANCE = 1e-6
DOCUMENT = slow_job("embedded")


@pytest.fixture(scope="module")
def reference(finished_run: Callable[[Spec], RunDir]) -> RunDir:
    """The uninterrupted run of DOCUMENT (its students, its telemetry)."""
    return finished_run(parse_spec({**DOCUMENT, "name": "reference"}))


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    service = Up(tmp_path_factory.mktemp("up"))
    service.start()
    yield service
    if service.process is not None and service.process.poll() is None:
        service.stop()


def submit(up: Up, **fields: Any) -> int:
    response = up.post("/api/v1/jobs", json={**DOCUMENT, **fields})
    assert response.status_code == 202, response.text
    job_id: int = response.json()["id"]
    return job_id


def distilling(up: Up, job_id: int) -> dict[str, Any]:
    def far_enough() -> dict[str, Any] | None:
        job: dict[str, Any] = up.get(f"/api/v1/jobs/{job_id}")
        return job if job["phase"] == "distill" and job["phase_progress"] >= 0.15 else None

    found: dict[str, Any] = wait_for(far_enough, 180, f"job {job_id} to distill", lambda: up.output()[-3000:])
    return found


def kill_worker(up: Up) -> list[psutil.Process]:
    """SIGKILL the worker under `pipebd up`; the job's processes it leaves behind (torchrun, ranks)."""
    worker = up.worker()
    left = worker.children(recursive=True)
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=10)
    return left


def assert_like_reference(up: Up, job: dict[str, Any], reference: RunDir) -> None:
    run_dir = RunDir(Path(up.folder / "data" / "runs" / f"job-{job['id']}"))
    assert_same_weights(load_students(run_dir), load_students(reference), rtol=TOLERANCE)
    assert_steps_once(up.telemetry(job["id"]), reference, 2)
    assert rank_processes(str(run_dir.root)) == []


def test_a_worker_killed_mid_distillation_is_restarted_and_its_job_resumes(up: Up, reference: RunDir) -> None:
    job_id = submit(up)
    distilling(up, job_id)
    left = kill_worker(up)
    assert left, "the worker ran no job processes"
    wait_for(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in left), 30, "orphans killed")
    job = up.wait_state(job_id, {"succeeded", "failed"})
    assert job["state"] == "succeeded", (job["termination_reason"], job["error"])
    assert up.process is not None and up.process.poll() is None  # the API never went away
    assert "starting it again" in up.output()
    first, second = job["attempts"]
    assert (first["outcome"], first["reason"]) == ("requeued", "worker_lost")
    assert second["outcome"] == "succeeded" and min(second["resumed_from"]) > 0
    assert job["restarts"] == 1
    assert_like_reference(up, job, reference)


def test_a_job_without_restarts_fails_worker_lost_and_resumes_from_the_api(up: Up, reference: RunDir) -> None:
    job_id = submit(up, max_restarts=0)
    distilling(up, job_id)
    kill_worker(up)
    job = up.wait_state(job_id, {"failed", "succeeded"}, timeout=60)
    assert (job["state"], job["termination_reason"]) == ("failed", "worker_lost")
    assert "died while the job was running (phase distill)" in job["error"]
    resumed = up.post(f"/api/v1/jobs/{job_id}/resume")
    assert resumed.status_code == 200 and resumed.json()["state"] == "queued", resumed.text
    job = up.wait_state(job_id, {"succeeded", "failed"})
    assert job["state"] == "succeeded", (job["termination_reason"], job["error"])
    assert [a["outcome"] for a in job["attempts"]] == ["failed", "succeeded"]
    assert min(job["attempts"][1]["resumed_from"]) > 0
    assert_like_reference(up, job, reference)


def test_a_clean_shutdown_keeps_queued_jobs_queued_and_requeues_the_running_one(up: Up, reference: RunDir) -> None:
    running, waiting = submit(up), submit(up)
    distilling(up, running)
    assert up.get(f"/api/v1/jobs/{waiting}")["state"] == "queued"
    assert up.stop() == 0
    up.start()  # the API answers before the worker takes anything: it imports torch first
    first, second = up.get(f"/api/v1/jobs/{running}"), up.get(f"/api/v1/jobs/{waiting}")
    assert first["attempts"][0]["outcome"] == "requeued" and first["attempts"][0]["reason"] == "worker_shutdown"
    assert second["attempts"] == [] or second["attempts"][0]["reason"] is None  # never taken off to be failed
    for job_id in (running, waiting):
        job = up.wait_state(job_id, {"succeeded", "failed"})
        assert job["state"] == "succeeded", (job["termination_reason"], job["error"])
        assert_like_reference(up, job, reference)
    assert min(up.get(f"/api/v1/jobs/{running}")["attempts"][1]["resumed_from"]) > 0
