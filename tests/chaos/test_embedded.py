"""Chaos tier, the embedded default (`pipebd up`, real API, worker with two slots, SQLite database and
broker, torchrun), two jobs through two faults: the worker killed with SIGKILL while both distil is started
again; one job resumes by itself, the other (max_restarts 0) fails `worker_lost` and resumes from the
API; then a clean shutdown while both distil again leaves a queued job queued and requeues the running ones
checkpointed, and the next start runs them all, the queued job's higher priority first. Both jobs are held
mid-distillation (their samples load slowly while a hold file exists) until the shutdown, so that neither
can finish first. Every finished job's students equal those of the uninterrupted run (1e-6), its telemetry
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
from tests.service.factories import tiny_job
from tests.service.slow_data import HOLD
from tests.service.workers import rank_processes, wait_for

TOLERANCE = 1e-6
DOCUMENT = slow_job("embedded")


@pytest.fixture(scope="module")
def reference(finished_run: Callable[[Spec], RunDir]) -> RunDir:
    """The uninterrupted run of DOCUMENT (its students, its telemetry)."""
    return finished_run(parse_spec({**DOCUMENT, "name": "reference"}))


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    folder = tmp_path_factory.mktemp("up")
    service = Up(folder, env={HOLD: str(folder / "hold")})
    service.start()
    yield service
    if service.process is not None and service.process.poll() is None:
        service.stop()


def submit(up: Up, **fields: Any) -> int:
    response = up.post("/api/v1/jobs", json={**DOCUMENT, **fields})
    assert response.status_code == 202, response.text
    job_id: int = response.json()["id"]
    return job_id


@pytest.fixture
def held(up: Up) -> Iterator[Path]:
    """Every job's samples load slowly until the test removes the returned file (and after the test)."""
    hold = Path(up.env[HOLD])
    hold.touch()
    yield hold
    hold.unlink(missing_ok=True)


def both_distilling(up: Up, first: int, second: int) -> None:
    """Wait until both jobs are mid-distillation at once."""
    distilling(up, first)
    distilling(up, second)
    assert up.get(f"/api/v1/jobs/{first}")["phase"] == "distill", "the first job left distill before the second got far"


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


def newest_seq(up: Up, job_id: int) -> int:
    """The highest distill step any rank of the job has stored telemetry for (0: none yet)."""
    return max((seq for _, seq in up.telemetry(job_id)), default=0)


def distilled_past(up: Up, job_id: int, seq: int) -> None:
    """Wait until the job has stored telemetry steps past `seq` (a poll's lag and a step more: at least one
    step of this attempt is done past where the last one stopped)."""
    wait_for(lambda: newest_seq(up, job_id) >= seq + 3, 180, f"job {job_id} to distil on", lambda: up.output()[-3000:])


def test_a_killed_worker_is_restarted_and_a_clean_shutdown_requeues_its_resumed_jobs_which_all_finish_like_one_run(
    up: Up, reference: RunDir, held: Path
) -> None:
    """Two jobs through two faults, each job's run feeding every claim: the worker SIGKILLed while both distil
    (one resumes by itself, the one without restarts fails `worker_lost` and resumes by API), then, while both
    distil again, `pipebd up` stopped cleanly with a higher-priority job queued behind them."""
    restarted, lost = submit(up), submit(up, max_restarts=0)  # two slots: both distil when the worker dies
    both_distilling(up, restarted, lost)
    left = kill_worker(up)
    assert len(left) >= 6, "two torchrun agents and their two ranks each"
    gone = lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in left)  # noqa: E731
    wait_for(gone, 30, "the dead worker's ranks to be killed")
    failed = up.wait_state(lost, {"failed", "succeeded"}, timeout=60)
    assert (failed["state"], failed["termination_reason"]) == ("failed", "worker_lost")
    assert "died while the job was running (phase distill)" in failed["error"]
    stored = {job_id: newest_seq(up, job_id) for job_id in (restarted, lost)}
    resumed = up.post(f"/api/v1/jobs/{lost}/resume")
    assert resumed.status_code == 200 and resumed.json()["state"] == "queued", resumed.text
    # still held: both second attempts distil (each past where the kill left it) when the service stops
    for job_id, first_outcome in ((restarted, "requeued"), (lost, "failed")):
        first = up.get(f"/api/v1/jobs/{job_id}")["attempts"][0]
        assert (first["outcome"], first["reason"]) == (first_outcome, "worker_lost")
        distilled_past(up, job_id, stored[job_id])
    assert up.get(f"/api/v1/jobs/{restarted}")["restarts"] == 1
    assert up.process is not None and up.process.poll() is None  # the API never went away
    assert "starting it again" in up.output()
    waiting = submit(up, **tiny_job("waiting"), priority=5)  # both slots are taken
    assert up.get(f"/api/v1/jobs/{waiting}")["state"] == "queued"
    assert up.stop() == 0
    held.unlink()
    up.start()  # the API answers before the worker takes anything: it imports torch first
    for job_id in (restarted, lost):
        attempt = up.get(f"/api/v1/jobs/{job_id}")["attempts"][1]
        assert (attempt["outcome"], attempt["reason"]) == ("preempted", "worker_shutdown")
        assert min(attempt["resumed_from"]) > 0  # the kill's checkpoint
    queued = up.get(f"/api/v1/jobs/{waiting}")
    assert queued["state"] in ("queued", "starting", "running") and len(queued["attempts"]) <= 1
    assert all(attempt["outcome"] is None for attempt in queued["attempts"])  # never taken off the queue to fail
    for job_id in (restarted, lost):
        job = up.wait_state(job_id, {"succeeded", "failed"})
        assert job["state"] == "succeeded", (job["termination_reason"], job["error"])
        _, second, third = job["attempts"]
        assert third["outcome"] == "succeeded"
        assert min(third["resumed_from"]) > max(second["resumed_from"])  # the shutdown checkpointed its steps
        assert_like_reference(up, job, reference)
    done = up.wait_state(waiting, {"succeeded", "failed"})
    assert done["state"] == "succeeded"
    # after the restart two slots took the priority-5 job and the older of the others; the newest came last
    assert up.get(f"/api/v1/jobs/{lost}")["attempts"][2]["started_at"] >= done["attempts"][0]["started_at"]
