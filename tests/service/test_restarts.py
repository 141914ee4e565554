"""Service tier: which endings restart a job. An infrastructure fault (a lost worker, a rank killed by
SIGKILL) requeues it while it has restarts left, with the reason on its attempt; a job's own failure (a
rank's exception, an out-of-memory error a rank raised, a bad spec, the time limit) never does. The
launcher's end-of-run step on a real database, without processes (the chaos tier kills real ones)."""

from __future__ import annotations

import threading

import pytest
from sqlmodel import Session

from app.core.attempts import attempts_of
from app.core.database import get_engine, migrate
from app.core.lifecycle import transition
from app.core.settings import Settings
from app.core.states import QUEUED, RUNNING, STARTING
from pipebd_core.job.outcomes import Termination
from pipebd_core.job.supervisor import Outcome
from tests.service.factories import insert_job
from tests.service.test_lifecycle_resume import stored
from worker.launcher import JobRunner

KILLED = "a rank was killed by SIGKILL, most often by the kernel's out-of-memory killer; launcher log:\n..."


@pytest.mark.parametrize(
    ("reason", "retryable"),
    [
        ("worker_lost", True),
        ("rank_killed", True),  # the diagnosis of a SIGKILLed rank (pipebd_core/job/diagnosis.py)
        ("oom", False),  # an out-of-memory error a rank raised: the job's own size
        ("rank_error", False),
        ("exit_code", False),
        ("launch_error", False),
        ("timeout", False),
        ("user_cancelled", False),
        ("user_paused", False),
        ("worker_shutdown", False),  # requeued, but without using a restart (lifecycle.settle)
    ],
)
def test_only_infrastructure_faults_restart(reason: str, retryable: bool) -> None:
    termination = Termination(reason)
    assert termination.retryable == termination.infrastructure == retryable


def running_job(settings: Settings, **fields: object) -> int:
    migrate(settings.database)
    job_id = insert_job(settings, **fields).id
    assert job_id is not None
    with Session(get_engine(settings.database)) as session:
        assert transition(session, job_id, STARTING, [QUEUED], worker="w1")
        assert transition(session, job_id, RUNNING, [STARTING])
        session.commit()
    return job_id


def test_a_fault_requeues_until_the_budget_is_spent_and_a_bug_never(settings: Settings) -> None:
    published: list[tuple[int, str]] = []
    runner = lambda job_id: JobRunner(job_id, settings, threading.Event(), publish=lambda *m: published.append(m))  # noqa: E731
    killed = Outcome("failed", Termination("rank_killed", KILLED), 1, "distill")
    job_id = running_job(settings, max_restarts=1)
    assert runner(job_id).finish(killed) == "queued"
    assert stored(settings, job_id).restarts == 1 and published == [(job_id, stored(settings, job_id).queue)]
    with Session(get_engine(settings.database)) as session:
        assert transition(session, job_id, STARTING, [QUEUED], worker="w2")
        assert transition(session, job_id, RUNNING, [STARTING])
        session.commit()
    assert runner(job_id).finish(killed) == "failed"  # its one restart is used
    job = stored(settings, job_id)
    assert (job.termination_reason, job.restarts) == ("rank_killed", 1) and len(published) == 1
    with Session(get_engine(settings.database)) as session:
        ends = [(a.number, a.worker, a.outcome, a.reason) for a in attempts_of(session, job_id)]
    assert ends == [(1, "w1", "requeued", "rank_killed"), (2, "w2", "failed", "rank_killed")]

    bug = running_job(settings)  # the server's default budget: 2
    assert (
        runner(bug).finish(Outcome("failed", Termination("rank_error", "rank 1 failed: ValueError"), 1, "distill"))
        == "failed"
    )
    assert stored(settings, bug).restarts == 0 and len(published) == 1
    off = running_job(settings, max_restarts=0)
    assert runner(off).finish(Outcome("failed", Termination("worker_lost", "gone"), None, "distill")) == "failed"
    assert stored(settings, off).termination_reason == "worker_lost" and len(published) == 1
