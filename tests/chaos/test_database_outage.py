"""Chaos tier: PostgreSQL (a throw-away server of this session, never the machine's) stopped while a job
distils, then started again. During the outage the API answers 503 with the reason, not 500, and the
worker keeps its ranks running; once the database is back the API recovers and the worker stores the
telemetry it kept: the job succeeds with the uninterrupted run's students and every step stored once. And a
webhook answered 2xx while the database stops is recorded delivered once it is back, never sent again."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.core.deliveries import deliver_due, new_client
from app.main import create_app
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, parse_spec
from tests.chaos.embedded import assert_steps_once, telemetry_rows
from tests.chaos.jobs import slow_job
from tests.chaos.test_launcher_faults import distilling, in_thread, queued_job, stored
from tests.helpers import assert_same_weights, load_students
from tests.service.conftest import make_settings
from tests.service.receiver import Received, start_receiver
from tests.service.services import Service, create_database, start_postgres
from tests.service.test_webhooks import add_hook, deliveries
from tests.service.workers import rank_processes, wait_for
from worker.launcher import JobRunner

DOCUMENT = slow_job("outage", mode="tr_dpu")


@pytest.fixture(scope="module")
def postgres() -> Iterator[Service]:
    service = start_postgres(own=True)
    if service.url is None:
        pytest.skip(service.reason)
    yield service
    service.stop()


def lines(run_dir: RunDir) -> int:
    return sum(
        len(run_dir.metrics(rank).read_text().splitlines()) for rank in range(2) if run_dir.metrics(rank).exists()
    )


def test_a_postgresql_restart_mid_job_loses_and_repeats_nothing(
    tmp_path: Path, postgres: Service, finished_run: Callable[[Spec], RunDir]
) -> None:
    assert postgres.url is not None
    reference = finished_run(parse_spec({**DOCUMENT, "name": "reference"}))
    settings = make_settings(tmp_path, create_database(postgres.url), poll_s=0.1, kill_grace_s=2.0)
    job_id = queued_job(settings, DOCUMENT)
    with TestClient(create_app(settings)) as client:
        thread, outcome = in_thread(JobRunner(job_id, settings, threading.Event()).run)
        distilling(settings, job_id)
        run_dir = RunDir(Path(stored(settings, job_id).run_dir or ""))
        postgres.halt()
        try:
            down = client.get(f"/api/v1/jobs/{job_id}")
            assert down.status_code == 503, down.text
            assert down.json()["detail"].startswith("the database does not answer (")
            assert down.headers["Retry-After"] == "5"
            before = lines(run_dir)
            wait_for(lambda: lines(run_dir) >= before + 4, 60, "the ranks to go on training")
            assert rank_processes(str(run_dir.root)), "the worker kept its ranks"
        finally:
            postgres.start()
        thread.join(timeout=120)
        assert outcome == ["succeeded"]
        job = client.get(f"/api/v1/jobs/{job_id}")
        assert job.status_code == 200 and job.json()["state"] == "succeeded"
    assert_same_weights(load_students(run_dir), load_students(reference), rtol=1e-6)
    assert_steps_once(telemetry_rows(settings.database, job_id), reference, 2)


def test_a_webhook_answered_while_postgresql_stops_is_recorded_delivered_and_never_sent_again(
    tmp_path: Path, postgres: Service
) -> None:
    assert postgres.url is not None
    settings = make_settings(tmp_path, create_database(postgres.url), webhook_poll_s=3600.0, webhook_timeout_s=5.0)
    receiver = start_receiver()

    def stop_the_database_then_answer(_: Received) -> None:  # the answer comes while the database is down
        postgres.halt()
        threading.Timer(2.0, postgres.start).start()

    try:
        with TestClient(create_app(settings)) as client:
            hook = add_hook(client, receiver.url + "/hook", ["job.cancelled"])
            job_id = queued_job(settings, DOCUMENT)
            assert client.post(f"/api/v1/jobs/{job_id}/cancel").json()["state"] == "cancelled"
            receiver.before_answer = stop_the_database_then_answer
            with new_client() as http:
                assert deliver_due(settings, http) == ["succeeded"]  # stored once the database is back
                receiver.before_answer = None
                assert deliver_due(settings, http, now=10**10) == []  # nothing due, ever again
            (entry,) = deliveries(client, hook)
    finally:
        receiver.stop()
    assert entry["state"] == "succeeded" and entry["attempts"] == 1 and entry["last_status"] == 200
    assert len(receiver.on("/hook")) == 1
