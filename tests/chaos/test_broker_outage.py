"""Chaos tier: Redis (a throw-away server of this session, never the machine's) stopped while a job
distils on a real Celery worker, then started again (empty: it keeps nothing on disk). The running job
never needed the broker and succeeds with the uninterrupted run's students; a submission during the
outage is refused with 503 and nothing is stored; once Redis is back the worker reconnects by itself and
runs the next job."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.core.tables import Job
from app.main import create_app
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, parse_spec
from tests.chaos.jobs import slow_job
from tests.helpers import assert_same_weights, load_students
from tests.service.conftest import make_settings
from tests.service.factories import count_rows, tiny_job
from tests.service.services import Service, redis_answers, start_redis
from tests.service.workers import start_worker, wait_for

DOCUMENT = slow_job("broker-outage")


@pytest.fixture(scope="module")
def broker() -> Iterator[Service]:
    service = start_redis(own=True)
    if service.url is None:
        pytest.skip(service.reason)
    yield service
    service.stop()


def test_a_redis_restart_mid_job_loses_nothing(
    tmp_path: Path, broker: Service, finished_run: Callable[[Spec], RunDir]
) -> None:
    assert broker.url is not None
    reference = finished_run(parse_spec({**DOCUMENT, "name": "reference"}))
    allow = "pipebd_core.workloads,tests.service.slow_data"
    settings = make_settings(
        tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}", broker_url=f"{broker.url}/0", factory_allowlist=allow
    )
    with TestClient(create_app(settings)) as client:
        worker = start_worker(settings, "redis-outage", devices=2)
        try:

            def job(job_id: int) -> dict[str, object]:
                answer: dict[str, object] = client.get(f"/api/v1/jobs/{job_id}").json()
                return answer

            job_id = client.post("/api/v1/jobs", json=DOCUMENT).json()["id"]
            wait_for(lambda: float(job(job_id)["phase_progress"]) >= 0.15, 180, "the job to distill", worker.output)  # type: ignore[arg-type]
            broker.halt()
            assert not redis_answers(broker.url)
            stored = count_rows(settings, Job)
            refused = client.post("/api/v1/jobs", json=tiny_job("during"))
            assert refused.status_code == 503 and "the broker did not accept the job" in refused.json()["detail"]
            assert count_rows(settings, Job) == stored
            broker.start()
            done = wait_for(lambda: job(job_id)["state"] in ("succeeded", "failed") and job(job_id), 180, "the job")
            assert done["state"] == "succeeded", (done["termination_reason"], done["error"])
            after = client.post("/api/v1/jobs", json=tiny_job("after", schedule={"nproc": 1})).json()["id"]
            ended = wait_for(lambda: job(after)["state"] in ("succeeded", "failed") and job(after), 180, "the next job")
            assert ended["state"] == "succeeded", worker.output()[-3000:]
        finally:
            worker.stop()
    run_dir = RunDir(settings.runs / f"job-{job_id}")
    assert_same_weights(load_students(run_dir), load_students(reference), rtol=1e-6)
