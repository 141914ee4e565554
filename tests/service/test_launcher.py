"""Service tier: the launcher in this process, on a real database with real torchrun jobs: the wall-clock
limit stops every rank and fails the job; a worker shutting down (while the job distils, or while it
profiles) stops every rank and puts the job back in the queue, checkpointed (tests/chaos resumes one), its
attempt `preempted`; ranks that reach no step boundary within the preemption grace are stopped at once; a run
whose job was reaped and claimed again elsewhere stops and writes nothing more."""

from __future__ import annotations

import threading
from pathlib import Path

from sqlalchemy import func, update
from sqlmodel import col, select

from app.core.attempts import attempts_of
from app.core.database import session_scope
from app.core.settings import Settings
from app.core.tables import Job, JobEvent, JobMetric, now
from pipebd_core.rundir import RunDir
from tests.service.conftest import make_settings
from tests.service.factories import queued_job, stored, tiny_job
from tests.service.slow_data import FACTORY as SLOW_DATA
from tests.service.workers import rank_processes, wait_for
from worker.launcher import JobRunner


def test_a_job_over_its_time_limit_fails_with_timeout(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}", job_timeout_s=3.0, kill_grace_s=2.0, poll_s=0.1
    )
    job_id = queued_job(settings)
    assert JobRunner(job_id, settings, threading.Event()).run() == "failed"
    job = stored(settings, job_id)
    assert job.termination_reason == "timeout" and job.error == "the job ran longer than 3 s"
    assert job.run_dir is not None and rank_processes(job.run_dir) == []


def test_a_worker_shutting_down_checkpoints_its_job_and_requeues_it(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}", kill_grace_s=2.0, poll_s=0.1)
    job_id = queued_job(settings)
    outcome: list[str] = []
    shutdown = threading.Event()
    runner = threading.Thread(target=lambda: outcome.append(JobRunner(job_id, settings, shutdown).run()))
    runner.start()
    wait_for(lambda: stored(settings, job_id).phase == "distill", 60, "the job to distill")
    shutdown.set()  # the ranks stop at their next step boundary: on a loaded machine that can be a minute away
    runner.join(timeout=300)
    job = stored(settings, job_id)
    assert not runner.is_alive(), "the job did not stop within 300 s of the shutdown"
    assert outcome == ["queued"] and job.termination_reason is None and job.restarts == 0
    assert job.run_dir is not None and rank_processes(job.run_dir) == []
    assert any(Path(job.run_dir, "checkpoints").rglob("step-*.pt"))  # every block saved where it stopped
    phases = {record["name"]: record for record in job.phases or []}
    assert (phases["distill"]["outcome"], phases["distill"]["reason"]) == ("cancelled", "worker_shutdown")
    with session_scope(settings.database) as session:
        assert [(a.outcome, a.reason) for a in attempts_of(session, job_id)] == [("preempted", "worker_shutdown")]
    published: list[tuple[int, str]] = []  # a worker shutting down takes no job: it puts the message back
    assert JobRunner(job_id, settings, shutdown, publish=lambda *m: published.append(m)).run() == "not claimed"
    assert published == [(job_id, job.queue)] and stored(settings, job_id).state == "queued"


def test_a_worker_shutting_down_while_profiling_stops_the_profiler(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}", kill_grace_s=2.0, poll_s=0.1)
    data = {"dataset": "custom", "factory": SLOW_DATA, "options": {"delay_s": 1.0}, "batch_size": 4}
    job_id = queued_job(settings, tiny_job("slow-profile", schedule={"profile": True}, data=data))
    outcome: list[str] = []
    shutdown = threading.Event()
    runner = threading.Thread(target=lambda: outcome.append(JobRunner(job_id, settings, shutdown).run()))
    runner.start()
    wait_for(lambda: stored(settings, job_id).pid is not None, 120, "the profiling job to start")
    run_dir = stored(settings, job_id).run_dir
    assert run_dir is not None
    wait_for(lambda: len(rank_processes(run_dir)) >= 3, 60, "the profiler's ranks")  # agent and 2 ranks
    shutdown.set()
    runner.join(timeout=15)
    job = stored(settings, job_id)
    assert outcome == ["queued"] and job.pid is None and rank_processes(run_dir) == []
    phases = {record["name"]: record for record in job.phases or []}
    assert phases["profile"]["outcome"] == "cancelled"  # measured again when it runs next


def test_ranks_that_reach_no_step_boundary_within_the_preemption_grace_are_stopped_at_once(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}", kill_grace_s=2.0, poll_s=0.1, preempt_grace_s=0.5
    )
    data = {"dataset": "custom", "factory": SLOW_DATA, "options": {"delay_s": 2.0}, "batch_size": 4}
    job_id = queued_job(settings, tiny_job("slow-steps", data=data))  # a step loads for 8 s: no boundary soon
    outcome: list[str] = []
    shutdown = threading.Event()
    runner = threading.Thread(target=lambda: outcome.append(JobRunner(job_id, settings, shutdown).run()))
    runner.start()
    wait_for(lambda: stored(settings, job_id).phase == "distill", 60, "the job to distill")
    run_dir = stored(settings, job_id).run_dir
    assert run_dir is not None
    wait_for(lambda: len(rank_processes(run_dir)) >= 3, 60, "the agent and its 2 ranks")
    shutdown.set()
    runner.join(timeout=30)  # the grace, then the kill grace at most
    job = stored(settings, job_id)
    assert outcome == ["queued"] and job.restarts == 0 and rank_processes(run_dir) == []
    past = [event for event in RunDir(Path(run_dir)).read_events() if event["event"] == "stop_past_grace"]
    assert [(event["reason"], event["grace_s"]) for event in past] == [("worker_shutdown", 0.5)]
    with session_scope(settings.database) as session:
        assert [(a.outcome, a.reason) for a in attempts_of(session, job_id)] == [("preempted", "worker_shutdown")]


def metric_rows(settings: Settings, job_id: int) -> int:
    with session_scope(settings.database) as session:
        return session.exec(select(func.count()).select_from(JobMetric).where(JobMetric.job_id == job_id)).one()


def event_rows(settings: Settings, job_id: int, kind: str) -> int:
    with session_scope(settings.database) as session:
        query = select(func.count()).select_from(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == kind)
        return session.exec(query).one()


def test_a_run_whose_job_was_claimed_again_elsewhere_stops_and_writes_nothing_more(tmp_path: Path) -> None:
    """A worker whose heartbeats went stale (a database outage, a stalled machine) has its job reaped and claimed by
    another worker while it still runs it: its run stores no more telemetry, beats no more for the job, stops its
    ranks and leaves the other claim's state, phase, phases and process id as they are, and adds no phase event
    (the short soak found a step stored twice this way)."""
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}", kill_grace_s=2.0, poll_s=0.1)
    job_id = queued_job(settings)
    outcome: list[str] = []
    runner = threading.Thread(target=lambda: outcome.append(JobRunner(job_id, settings, threading.Event()).run()))
    runner.start()
    wait_for(lambda: metric_rows(settings, job_id) > 0, 120, "the job's first telemetry stored")
    with session_scope(settings.database) as session:  # reaped, then claimed by worker-b, as the reaper and a claim do
        claim = {"worker": "worker-b", "worker_pid": 1, "started_at": now(), "heartbeat_at": 1.0}
        theirs = {"phase": "profile", "phases": [], "pid": 2}  # what worker-b's run wrote: the stopping run's differ
        session.execute(update(Job).where(col(Job.id) == job_id).values(**claim, **theirs))
    taken, phase_events = metric_rows(settings, job_id), event_rows(settings, job_id, "phase")
    runner.join(timeout=120)
    job = stored(settings, job_id)
    assert not runner.is_alive(), "the run went on after its job was claimed elsewhere"
    assert outcome == ["running"] and (job.state, job.worker, job.heartbeat_at) == ("running", "worker-b", 1.0)
    assert metric_rows(settings, job_id) == taken  # not one line stored after the claim moved
    assert (job.phase, job.phases, job.pid) == ("profile", [], 2)  # nor its phases, nor its process id
    assert event_rows(settings, job_id, "phase") == phase_events
    assert job.run_dir is not None and rank_processes(job.run_dir) == []


def test_a_claim_waits_for_a_write_that_checked_it_still_holds_the_job(tmp_path: Path, database_url: str) -> None:
    """The fence's check and the writes after it are one: a claim by another worker that arrives between them
    waits for their commit (SQLite's driver starts no transaction on a read, so a check alone held nothing there
    and a batch of telemetry was stored after the claim moved)."""
    settings = make_settings(tmp_path, database_url)
    job_id = queued_job(settings)
    runner = JobRunner(job_id, settings, threading.Event())
    assert runner.claim()
    claimed = threading.Event()

    def claim_elsewhere() -> None:
        with session_scope(settings.database) as session:
            session.execute(update(Job).where(col(Job.id) == job_id).values(worker="worker-b", heartbeat_at=1.0))
        claimed.set()

    with session_scope(settings.database) as session:
        assert runner.holds(session)
        other = threading.Thread(target=claim_elsewhere)
        other.start()
        assert not claimed.wait(1.0), "another worker's claim committed between the check and the write"
        session.add(JobEvent(job_id=job_id, kind="phase", data={"phase": "profile"}))
    other.join(timeout=30)
    assert claimed.is_set()
    with session_scope(settings.database) as session:
        assert not runner.holds(session)
