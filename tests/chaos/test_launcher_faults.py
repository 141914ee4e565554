"""Chaos tier, the launcher in this process on a real database with real torchrun ranks: a pause then a
resume of a 3-rank `hybrid` job, and a rank killed with SIGKILL (a worker shutting down is in
test_embedded.py; that a job's own failures are never retried, in tests/service/test_restarts.py).
Each job ends `succeeded` with the weights of the uninterrupted run, its attempts say what happened,
no process is left behind, and its telemetry holds every step exactly once."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from sqlmodel import Session, select

from app.core.attempts import attempts_of
from app.core.database import get_engine
from app.core.lifecycle import request_pause, requeue
from app.core.settings import Settings
from app.core.states import PAUSED, QUEUED
from app.core.tables import JobAttempt, JobMetric
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, parse_spec
from tests.chaos.jobs import hybrid_job, slow_job
from tests.helpers import assert_same_weights, load_students
from tests.service.conftest import make_settings
from tests.service.factories import queued_job, stored
from tests.service.slow_data import HOLD
from tests.service.workers import rank_processes, wait_for
from worker.launcher import JobRunner

TOLERANCE = 1e-6


def attempts(settings: Settings, job_id: int) -> list[JobAttempt]:
    with Session(get_engine(settings.database)) as session:
        return attempts_of(session, job_id)


def in_thread(run: Callable[[], str]) -> tuple[threading.Thread, list[str]]:
    outcome: list[str] = []
    thread = threading.Thread(target=lambda: outcome.append(run()))
    thread.start()
    return thread, outcome


def distilling(settings: Settings, job_id: int, fraction: float = 0.15) -> None:
    """Wait until the job's ranks have stored telemetry for `fraction` of their steps."""
    wait_for(lambda: stored(settings, job_id).phase_progress >= fraction, 120, "the job to distill")


def assert_telemetry_once(settings: Settings, job_id: int, nproc: int) -> None:
    """Every rank's steps stored exactly once: seq 1.. with no gap and no repeat."""
    with Session(get_engine(settings.database)) as session:
        rows = session.exec(
            select(JobMetric.rank, JobMetric.seq).where(JobMetric.job_id == job_id, JobMetric.phase == "distill")
        ).all()
    assert {rank for rank, _ in rows} == set(range(nproc))
    for rank in range(nproc):
        seqs = sorted(seq for r, seq in rows if r == rank)
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"rank {rank}: {seqs}"
        assert len(seqs) == len(set(seqs))


@pytest.fixture(scope="module")
def reference(finished_run: Callable[[Spec], RunDir]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The students of the uninterrupted run of a spec (once per spec and session)."""

    def students(document: dict[str, Any]) -> dict[str, Any]:
        return load_students(finished_run(parse_spec({**document, "name": "reference"})))

    return students


def settings_for(tmp_path: Path) -> Settings:
    return make_settings(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}", kill_grace_s=2.0, poll_s=0.1)


def test_pause_then_resume_of_a_hybrid_job_on_3_ranks_equals_the_uninterrupted_run(
    tmp_path: Path, reference: Callable[[dict[str, Any]], dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_for(tmp_path)
    document = hybrid_job("pause")
    job_id = queued_job(settings, document)
    hold = tmp_path / "hold"  # held, a step lasts a second: the pause lands mid-run however late it is seen
    hold.touch()
    monkeypatch.setenv(HOLD, str(hold))
    thread, outcome = in_thread(JobRunner(job_id, settings, threading.Event()).run)
    distilling(settings, job_id)
    with Session(get_engine(settings.database)) as session:
        assert request_pause(session, job_id)
        session.commit()
    thread.join(timeout=60)
    hold.unlink()
    job = stored(settings, job_id)
    assert outcome == [PAUSED] and job.state == PAUSED and job.termination_reason == "user_paused"
    assert job.run_dir is not None and rank_processes(job.run_dir) == [] and job.pid is None
    with Session(get_engine(settings.database)) as session:
        assert requeue(session, job_id, [PAUSED], note=None)
        session.commit()
    assert JobRunner(job_id, settings, threading.Event()).run() == "succeeded"
    first, second = attempts(settings, job_id)
    assert (first.outcome, first.reason, first.resumed_from) == (PAUSED, "user_paused", None)
    assert second.outcome == "succeeded" and second.resumed_from is not None
    assert len(set(second.resumed_from)) == 1 and 0 < second.resumed_from[0] < 24  # a pipeline: one common step
    assert_same_weights(load_students(RunDir(Path(job.run_dir))), reference(document), rtol=TOLERANCE)
    assert_telemetry_once(settings, job_id, 3)


def test_a_rank_killed_with_sigkill_restarts_from_checkpoints_and_succeeds(
    tmp_path: Path, reference: Callable[[dict[str, Any]], dict[str, Any]]
) -> None:
    settings = settings_for(tmp_path)
    document = slow_job("rank-killed")
    job_id = queued_job(settings, document)
    published: list[tuple[int, str]] = []
    thread, outcome = in_thread(
        JobRunner(job_id, settings, threading.Event(), publish=lambda *m: published.append(m)).run
    )
    distilling(settings, job_id, 0.3)
    run_dir = stored(settings, job_id).run_dir
    assert run_dir is not None
    leader = psutil.Process(stored(settings, job_id).pid)
    victim = leader.children(recursive=True)[-1]
    victim.send_signal(signal.SIGKILL)
    thread.join(timeout=60)
    job = stored(settings, job_id)
    assert outcome == [QUEUED] and job.restarts == 1 and published == [(job_id, job.queue)], job.error
    assert rank_processes(run_dir) == []
    assert JobRunner(job_id, settings, threading.Event()).run() == "succeeded"
    first, second = attempts(settings, job_id)
    assert (first.outcome, first.reason) == ("requeued", "rank_killed")
    assert second.resumed_from is not None and min(second.resumed_from) > 0
    assert_same_weights(load_students(RunDir(Path(run_dir))), reference(document), rtol=TOLERANCE)
    assert_telemetry_once(settings, job_id, 2)
