"""Service tier: a real Celery worker process on the embedded SQLite broker runs real torchrun jobs.

The session's `embedded` service (tests/service/conftest.py) runs most of them; its worker makes rank 2
raise at step 1, so a 3-rank job is the crash test. The test of jobs stopped while they profile
(one cancelled, then the worker killed under the other) starts a worker of its own with 2 slots.
"""

from __future__ import annotations

import io
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import torch
from fastapi.testclient import TestClient
from sqlmodel import Session

from app.core.database import get_engine
from app.core.settings import Settings
from app.core.tables import Job
from app.main import create_app
from tests.service.conftest import Embedded, make_settings
from tests.service.factories import long_job, tiny_job
from tests.service.slow_data import FACTORY as SLOW_DATA
from tests.service.sse import read_events
from tests.service.workers import WorkerProcess, rank_processes, start_worker, wait_for

JOB_TIMEOUT_S = 180
CANCEL_DEADLINE_S = 15


def line_count(folder: Path) -> int:
    return sum(len(path.read_text().splitlines()) for path in folder.glob("rank-*.jsonl"))


def wait_telemetry(embedded: Embedded, job_id: int) -> None:
    """Until the job's ranks have stored telemetry: it is running its distillation."""
    client = embedded.client
    wait_for(
        lambda: client.get(f"/api/v1/jobs/{job_id}/metrics").json()["total"] > 0,
        JOB_TIMEOUT_S,
        f"telemetry of job {job_id}",
        embedded.worker.output,
    )


def test_a_job_runs_to_success_with_telemetry_logs_and_artifacts(
    embedded: Embedded,
) -> None:
    client = embedded.client
    job_id = client.post("/api/v1/jobs", json=tiny_job()).json()["id"]
    job = embedded.wait_state(job_id, {"succeeded", "failed"}, JOB_TIMEOUT_S)
    assert job["state"] == "succeeded", job["error"]
    assert job["progress"] == 1.0 and job["exit_code"] == 0 and job["worker"] == "embedded"
    assert job["plan_summary"]["mode"] == "tr_dpu" and job["plan_summary"]["nproc"] == 2
    detail = client.get(f"/api/v1/jobs/{job_id}").json()
    run_dir = embedded.job_dir(job_id)
    assert detail["spec"]["name"] == "tiny"
    metrics = client.get(f"/api/v1/jobs/{job_id}/metrics", params={"max_points": 10000}).json()
    assert (
        metrics["total"] == line_count(run_dir / "metrics" / "distill") > 0
    )  # every telemetry line reached the database
    assert {point["rank"] for point in metrics["points"]} == {0, 1}
    events = read_events(client.get(f"/api/v1/jobs/{job_id}/events").text)
    assert [e["data"]["state"] for e in events if e.get("event") == "state"] == [
        "queued",
        "starting",
        "running",
        "succeeded",
    ]
    assert sum(len(e["data"]["records"]) for e in events if e.get("event") == "metrics") == metrics["total"]
    grown = {(e["data"]["phase"], e["data"]["rank"]): e["data"]["size"] for e in events if e.get("event") == "log"}
    for (phase, rank), size in grown.items():  # the last growth each log reported is its final size
        name = "launcher.log" if rank is None else f"rank-{rank}.log"
        assert (run_dir / "logs" / phase / name).stat().st_size == size
    assert {("distill", 0), ("distill", 1), ("finalize", None)} <= set(grown)  # each says what it does
    phases = [(p["name"], p["outcome"]) for p in detail["phases"]]
    assert phases == [("plan", "succeeded"), ("distill", "succeeded"), ("finalize", "succeeded")]
    assert detail["phase"] == "finalize"
    names = {item["name"] for item in client.get(f"/api/v1/jobs/{job_id}/artifacts").json()["data"]}
    assert {"student.pt", "plan.json", "summary.json", "metrics.csv"} <= names
    weights = torch.load(
        io.BytesIO(client.get(f"/api/v1/jobs/{job_id}/artifacts/student.pt").content), weights_only=True
    )
    assert sorted({key.split(".")[1] for key in weights}) == ["0", "1", "2", "3"]
    assert client.get(f"/api/v1/jobs/{job_id}/plan").json()["mode"] == "tr_dpu"
    rank_log = client.get(f"/api/v1/jobs/{job_id}/logs", params={"rank": 0}).json()
    rank_0 = run_dir / "logs" / "distill" / "rank-0.log"
    assert rank_log["file"] == "logs/distill/rank-0.log" and rank_log["size"] == rank_0.stat().st_size
    assert rank_log["next_offset"] == rank_log["size"]
    assert client.delete(f"/api/v1/jobs/{job_id}").status_code == 204
    assert not run_dir.exists()


def test_a_crashing_rank_fails_the_job_with_its_traceback(embedded: Embedded) -> None:
    client = embedded.client
    job_id = client.post("/api/v1/jobs", json=tiny_job(schedule={"nproc": 3})).json()["id"]
    job = embedded.wait_state(job_id, {"succeeded", "failed"}, JOB_TIMEOUT_S)
    assert job["state"] == "failed" and job["termination_reason"] == "rank_error"
    detail = client.get(f"/api/v1/jobs/{job_id}").json()
    assert (
        detail["error"].startswith("rank 2 failed: RuntimeError")
        and "Traceback (most recent call last)" in detail["error"]
    )
    assert detail["exit_code"] != 0
    rank_log = client.get(f"/api/v1/jobs/{job_id}/logs", params={"rank": 2}).json()["text"]
    assert "RuntimeError" in rank_log
    tail = client.get(f"/api/v1/jobs/{job_id}/logs", params={"rank": 2, "offset": 10, "limit": 5}).json()
    assert tail["offset"] == 10 and tail["next_offset"] == 15 and tail["text"] == rank_log[10:15]
    assert rank_processes(str(embedded.job_dir(job_id))) == []


def test_cancel_stops_every_rank(embedded: Embedded) -> None:
    client = embedded.client
    job_id = client.post("/api/v1/jobs", json=long_job()).json()["id"]
    wait_telemetry(embedded, job_id)
    run_dir = str(embedded.job_dir(job_id))
    ranks = rank_processes(run_dir)
    assert len(ranks) >= 3  # torchrun and two ranks
    assert not {"PIPEBD_DATABASE_URL", "PIPEBD_BROKER_URL"} & set(ranks[-1].environ())  # no secrets for user code
    asked = time.time()
    assert client.post(f"/api/v1/jobs/{job_id}/cancel").json()["state"] == "cancelling"
    job = embedded.wait_state(job_id, {"cancelled", "failed", "succeeded"}, CANCEL_DEADLINE_S)
    assert job["state"] == "cancelled" and job["termination_reason"] == "user_cancelled"
    wait_for(lambda: rank_processes(run_dir) == [], CANCEL_DEADLINE_S - (time.time() - asked), "every rank to exit")
    assert client.post(f"/api/v1/jobs/{job_id}/cancel").json()["state"] == "cancelled"  # idempotent
    events = [json.dumps(e) for e in read_events(client.get(f"/api/v1/jobs/{job_id}/events").text)]
    assert any('"cancelling"' in e for e in events) and any('"cancelled"' in e for e in events)


# --- stopped while profiling -----------------------------------------------------------------------------


def slow_profiling_job() -> dict[str, Any]:
    """A 2-rank job with profiling whose samples take 1 s to load: the profiler sleeps for tens of seconds."""
    data = {"dataset": "custom", "factory": SLOW_DATA, "options": {"delay_s": 1.0}, "batch_size": 4}
    return tiny_job("slow-profile", schedule={"profile": True}, data=data)


def profiling_settings(folder: Path, **overrides: object) -> Settings:
    allowlist = f"pipebd_core.workloads,{SLOW_DATA.partition(':')[0]}"
    return make_settings(folder, f"sqlite:///{folder / 'pipebd.db'}", factory_allowlist=allowlist, **overrides)


def start_two_slot_worker(settings: Settings, name: str) -> WorkerProcess:
    # two jobs at once: stopping a profiler must not rely on it being the worker's only child (nor stop the other's)
    return start_worker(settings, name, devices=2, extra_env={"PIPEBD_WORKER_SLOTS": "2"})


def profiler_processes(run_dir: str) -> list[psutil.Process]:
    """The job's profiling torchrun and ranks: they name its run directory on their command line."""
    return [p for p in rank_processes(run_dir) if "pipebd_core.profile.blocks" in " ".join(p.info["cmdline"] or [])]


def wait_profiling(client: TestClient, job_id: int, run_dir: str, worker: WorkerProcess) -> list[psutil.Process]:
    def started() -> list[psutil.Process] | None:
        found = profiler_processes(run_dir)
        return found if len(found) >= 3 else None  # the torchrun agent and both ranks

    found: list[psutil.Process] = wait_for(started, JOB_TIMEOUT_S, "the profiler's ranks", worker.output)
    job = client.get(f"/api/v1/jobs/{job_id}").json()
    assert job["state"] == "running" and job["phase"] == "profile"
    return found


def stored_pid(settings: Settings, job_id: int) -> int | None:
    with Session(get_engine(settings.database)) as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job.pid


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def nothing_left(profiling: list[psutil.Process], run_dir: str) -> bool:
    return not any(alive(p) for p in profiling) and rank_processes(run_dir) == []


def test_a_cancel_while_profiling_stops_that_profiler_at_once_and_a_killed_worker_leaves_no_profiler_behind(
    tmp_path: Path,
) -> None:
    """One worker, two jobs profiling at once: the cancelled one's profiler stops within the deadline while
    the other profiles on; then the worker is SIGKILLed and the other's orphaned profiler is killed too."""
    settings = profiling_settings(tmp_path, stale_after_s=3.0, reaper_interval_s=0.5, max_restarts=0)
    with TestClient(create_app(settings)) as client:
        worker = start_two_slot_worker(settings, "doomed")
        try:
            job_id, doomed_id = (client.post("/api/v1/jobs", json=slow_profiling_job()).json()["id"] for _ in range(2))
            run_dir, doomed_dir = (str(settings.runs / f"job-{i}") for i in (job_id, doomed_id))
            profiling = wait_profiling(client, job_id, run_dir, worker)
            doomed_profiling = wait_profiling(client, doomed_id, doomed_dir, worker)
            agent = stored_pid(settings, job_id)  # recorded on the job while it starts
            assert agent in {p.pid for p in profiling} and os.getsid(agent) == agent  # a session of its own
            asked = time.time()
            assert client.post(f"/api/v1/jobs/{job_id}/cancel").json()["state"] == "cancelling"
            job = Embedded(client, settings, worker).wait_state(
                job_id, {"cancelled", "failed", "succeeded"}, CANCEL_DEADLINE_S
            )
            assert job["state"] == "cancelled" and job["termination_reason"] == "user_cancelled", job["error"]
            left = CANCEL_DEADLINE_S - (time.time() - asked)
            wait_for(lambda: nothing_left(profiling, run_dir), left, "the profiler and its ranks to exit")
            stopped_s = time.time() - asked
            events = read_events(client.get(f"/api/v1/jobs/{job_id}/events").text)
            states = [e["data"]["state"] for e in events if e.get("event") == "state"]
            assert states == ["queued", "starting", "running", "cancelling", "cancelled"]
            phases = [(p["name"], p["outcome"]) for p in client.get(f"/api/v1/jobs/{job_id}").json()["phases"]]
            assert phases == [("profile", "cancelled"), ("plan", None), ("distill", None), ("finalize", None)]
            assert stored_pid(settings, job_id) is None
            print(f"cancel while profiling: cancelled and every process gone {stopped_s:.1f} s after the request")
            doomed = client.get(f"/api/v1/jobs/{doomed_id}").json()  # the other job's profiler was left alone
            assert (doomed["state"], doomed["phase"]) == ("running", "profile")
            assert all(alive(p) for p in doomed_profiling)

            os.kill(worker.process.pid, signal.SIGKILL)  # its profiling torchrun lives on in its own session
            worker.process.wait()
            killed = time.time()

            def lost() -> dict[str, Any] | None:
                job: dict[str, Any] = client.get(f"/api/v1/jobs/{doomed_id}").json()
                return job if job["state"] == "failed" else None

            job = wait_for(lost, 30, "the reaper", worker.output)
            assert job["termination_reason"] == "worker_lost"
            assert "the worker doomed (pid" in job["error"] and "died" in job["error"]  # seen at once, on this host
            assert "(phase profile)" in job["error"]
            wait_for(lambda: nothing_left(doomed_profiling, doomed_dir), 15, "the orphaned profiler to be killed")
            print(f"worker killed while profiling: profiler gone {time.time() - killed:.1f} s after the kill")
        finally:
            worker.stop()


def test_a_sweeps_bulk_cancel_stops_its_running_child_and_leaves_no_process(embedded: Embedded) -> None:
    client = embedded.client
    body = {"spec": long_job(), "grid": {"train.lr": [0.01, 0.02]}, "max_parallel": 1}
    sweep = client.post("/api/v1/sweeps", json=body).json()
    first, second = (job["id"] for job in sweep["jobs"])
    wait_telemetry(embedded, first)
    run_dir = str(embedded.job_dir(first))
    assert len(rank_processes(run_dir)) >= 3 and client.get(f"/api/v1/jobs/{second}").json()["state"] == "queued"
    cancelled = client.post(f"/api/v1/sweeps/{sweep['id']}/cancel").json()
    assert [job["state"] for job in cancelled["jobs"]] == ["cancelling", "cancelled"]
    embedded.wait_state(first, {"cancelled", "failed", "succeeded"}, CANCEL_DEADLINE_S)
    wait_for(lambda: rank_processes(run_dir) == [], CANCEL_DEADLINE_S, "every rank to exit")
    read = client.get(f"/api/v1/sweeps/{sweep['id']}").json()
    assert read["state"] == "cancelled" and read["progress"]["jobs"]["cancelled"] == 2
    assert client.get(f"/api/v1/jobs/{second}").json()["started_at"] is None  # never launched
