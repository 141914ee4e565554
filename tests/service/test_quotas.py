"""Service tier: weighted fair share and per-token quotas on real databases (SQLite and PostgreSQL), in
process: jobs are rows, a worker's claim is the launcher's own (`JobRunner.claim`), a job ends by its
lifecycle move; nothing is launched.

Two tenants with weights 1 and 3 on 4 devices: the claims and the running devices follow the weights,
each tenant's priorities hold, a newcomer starts next; `max_running` holds a tenant's jobs queued with the
reason, even against 8 concurrent claims; a spent device-hour budget refuses submissions (429 naming the
quota) and holds queued jobs until the window frees.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlmodel import Session, col, func, select

from app.api.auth import fingerprint
from app.core.database import get_engine, migrate
from app.core.fairshare import queued, shares
from app.core.lifecycle import transition
from app.core.priority import next_queued, wake_held
from app.core.queue import queue_name
from app.core.quotas import HOUR_S, release_budgets
from app.core.settings import Settings
from app.core.states import ACTIVE, RUNNING, STARTING, SUCCEEDED
from app.core.tables import Job, JobAttempt, TenantQuota
from app.main import create_app
from app.services.jobs import queue_position, waiting_reason
from app.services.quotas import set_quota
from tests.service.conftest import make_settings
from tests.service.factories import insert_job, stored, tiny_job
from worker.launcher import JobRunner

TOKEN = "quota-token-0123456789"


def add_quota(settings: Settings, tenant: str, **changes: Any) -> None:
    with Session(get_engine(settings.database)) as session:
        set_quota(session, tenant=tenant, name=tenant, changes=changes)
        session.commit()


def add_jobs(settings: Settings, tenant: str, priorities: list[int]) -> list[int]:
    """Queued 1-rank jobs of `tenant`, one per priority, oldest first; their ids."""
    jobs = [insert_job(settings, tenant=tenant, priority=p, nproc=1, queue=queue_name(1)) for p in priorities]
    return [job.id for job in jobs if job.id is not None]


def claim(settings: Settings, job_id: int) -> bool:
    """A worker's claim of the job, as the launcher makes it (the sweep's and the tenant's checks included)."""
    return JobRunner(job_id, settings, threading.Event()).claim()


def move(settings: Settings, job_id: int, target: str, source: str) -> None:
    with Session(get_engine(settings.database)) as session:
        assert transition(session, job_id, target, [source])
        session.commit()


def start_next(settings: Settings) -> int | None:
    """A free 1-device worker: the job it chooses, claimed and running; None when it chooses none."""
    job_id = next_queued(settings.database, 1)
    if job_id is None:
        return None
    assert claim(settings, job_id)
    move(settings, job_id, RUNNING, STARTING)
    return job_id


def detail(settings: Settings, job_id: int) -> tuple[int | None, str | None]:
    with Session(get_engine(settings.database)) as session:
        job = session.get(Job, job_id)
        assert job is not None
        return queue_position(session, job=job), waiting_reason(session, job=job, stale_after_s=30)


def test_claims_follow_the_weights_and_each_tenants_priorities(settings: Settings) -> None:
    """4 devices, jobs ending oldest first: after the first 4 starts, a holds 1 device and b 3 at every
    step, and of 20 starts b gets 15; a's own start in order of priority, then age."""
    migrate(settings.database)
    add_quota(settings, "a", weight=1.0)
    add_quota(settings, "b", weight=3.0)
    a_jobs = add_jobs(settings, "a", [0, 0, 5, 0, 9, 0, 0, 0, 0, 0])
    add_jobs(settings, "b", [0] * 20)
    running: deque[int] = deque()
    started: list[Job] = []
    held: list[Counter[str | None]] = []
    for _ in range(20):
        if len(running) == 4:
            move(settings, running.popleft(), SUCCEEDED, RUNNING)
        job_id = start_next(settings)
        assert job_id is not None
        running.append(job_id)
        started.append(stored(settings, job_id))
        held.append(Counter(stored(settings, r).tenant for r in running))
    assert Counter(job.tenant for job in started) == {"a": 5, "b": 15}
    assert all(counts == {"a": 1, "b": 3} for counts in held[3:]), held
    a_started = [job.id for job in started if job.tenant == "a"]
    assert a_started == [a_jobs[4], a_jobs[2], a_jobs[0], a_jobs[1], a_jobs[3]]  # priority 9, 5, then the oldest


def test_a_newcomer_starts_next_and_the_order_is_explained(settings: Settings) -> None:
    """A busy tenant (weight 10, priority 100 jobs) holds 3 devices; a newcomer's priority-0 job starts next."""
    migrate(settings.database)
    add_quota(settings, "busy", weight=10.0)
    busy = add_jobs(settings, "busy", [100] * 6)
    for _ in range(3):
        start_next(settings)
    (newcomer,) = add_jobs(settings, "new", [0])
    assert detail(settings, newcomer)[0] == 0
    position, reason = detail(settings, busy[4])
    assert position == 2
    assert reason is not None and reason.startswith("3rd in line, 2 queued jobs start first under fair share")
    assert "tenant busy uses 3 running devices at weight 10 (0.30 per unit)" in reason
    assert "tenant new" in reason
    with TestClient(create_app(settings)) as client:  # the job's page says the same
        page = client.get(f"/jobs/{busy[4]}")
    assert page.status_code == 200 and "Why it waits: 3rd in line, 2 queued jobs start first" in page.text
    assert start_next(settings) == newcomer


def test_a_job_on_several_nodes_counts_every_nodes_ranks(settings: Settings) -> None:
    """A tenant's share counts a gang job's ranks on all its nodes: a's 2 x 2 job outweighs b's 3 ranks, so
    b's job starts before a's older one."""
    migrate(settings.database)
    insert_job(settings, RUNNING, tenant="a", nproc=2, nodes=2, queue=queue_name(2))
    insert_job(settings, RUNNING, tenant="b", nproc=3, queue=queue_name(3))
    (a_next,) = add_jobs(settings, "a", [0])
    gang = insert_job(settings, tenant="a", nproc=1, nodes=3, queue=queue_name(1))
    (b_next,) = add_jobs(settings, "b", [0])
    with Session(get_engine(settings.database)) as session:
        assert {tenant: share.devices for tenant, share in shares(session).items()} == {"a": 4, "b": 3}
        assert sorted((job.id, job.devices) for job in queued(session)) == [(a_next, 1), (gang.id, 3), (b_next, 1)]
    assert next_queued(settings.database, 1) == b_next


def test_max_running_holds_a_tenants_jobs_queued_with_the_reason(settings: Settings) -> None:
    migrate(settings.database)
    add_quota(settings, "a", max_running=2)
    a_jobs = add_jobs(settings, "a", [0, 0, 0, 0])
    (b_job,) = add_jobs(settings, "b", [0])
    assert [start_next(settings) for _ in range(3)] == [a_jobs[0], b_job, a_jobs[1]]
    assert next_queued(settings.database, 1) is None  # a's jobs wait; nobody else's is queued
    assert not claim(settings, a_jobs[2])  # a worker that got its message anyway: the claim re-counts
    position, reason = detail(settings, a_jobs[3])
    assert position == 1
    assert reason == "tenant a runs 2 of its 2 concurrent jobs (max_running); it starts when one of them ends"
    move(settings, a_jobs[0], SUCCEEDED, RUNNING)
    published: list[tuple[int, str]] = []
    wake_held(settings.database, a_jobs[0], lambda job_id, queue: published.append((job_id, queue)))
    assert published == [(a_jobs[2], queue_name(1))]  # its message was dropped while held: a new one
    assert start_next(settings) == a_jobs[2]


def test_concurrent_claims_never_exceed_max_running(settings: Settings) -> None:
    """8 workers claim 8 jobs of one tenant at once, each on its own connection: exactly 2 start."""
    migrate(settings.database)
    add_quota(settings, "a", max_running=2)
    jobs = add_jobs(settings, "a", [0] * 8)
    barrier = threading.Barrier(len(jobs))

    def claim_at_once(job_id: int) -> bool:
        barrier.wait()
        return claim(settings, job_id)

    with ThreadPoolExecutor(len(jobs)) as pool:
        claimed = list(pool.map(claim_at_once, jobs))
    assert claimed.count(True) == 2
    with Session(get_engine(settings.database)) as session:
        launched = select(func.count()).select_from(Job).where(col(Job.state).in_(sorted(ACTIVE)))
        assert session.exec(launched).one() == 2


def spend(settings: Settings, tenant: str, nproc: int, hours_ago: float, hours: float, nodes: int = 1) -> None:
    """A finished job of `tenant` whose one attempt ran `hours` on `nproc` ranks of each of `nodes` nodes,
    ending `hours_ago`."""
    job = insert_job(settings, "succeeded", tenant=tenant, nproc=nproc, nodes=nodes, queue=queue_name(nproc))
    end = time.time() - hours_ago * HOUR_S
    with Session(get_engine(settings.database)) as session:
        session.add(JobAttempt(job_id=job.id, number=1, started_at=end - hours * HOUR_S, ended_at=end, outcome="x"))
        session.commit()


def test_a_spent_budget_refuses_submissions_and_holds_queued_jobs_until_the_window_frees(
    tmp_path: Path, database_url: str
) -> None:
    settings = make_settings(tmp_path, database_url, api_tokens=f"{TOKEN}=submit")
    tenant = fingerprint(TOKEN)
    migrate(settings.database)
    with Session(get_engine(settings.database)) as session:
        set_quota(session, tenant=tenant, name="alice", changes={"device_hours": 1.0})
        session.commit()
    (queued,) = add_jobs(settings, tenant, [0])
    spend(settings, tenant, nproc=1, nodes=2, hours_ago=1.0, hours=1.0)  # 2 device-hours (two nodes' ranks)
    with TestClient(create_app(settings)) as client:
        answer = client.post("/api/v1/jobs", json=tiny_job(), headers={"Authorization": f"Bearer {TOKEN}"})
        mine = client.get("/api/v1/quota", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert mine["name"] == "alice" and mine["device_hours"] == 1.0 and mine["max_running"] is None
    assert abs(mine["used_device_hours"] - 2.0) < 0.01 and mine["running_jobs"] == 0
    assert answer.status_code == 429, answer.text
    detail_text = answer.json()["detail"]
    assert "tenant alice used 2.00 of its 1 device-hours (ranks x hours) in the last 24 h" in detail_text
    assert "device_hours quota is spent" in detail_text and "pipebd quotas set" in detail_text
    assert abs(int(answer.headers["Retry-After"]) - 23 * HOUR_S) < 60
    assert next_queued(settings.database, 1) is None  # the worker passes its job over, and marks the budget
    with Session(get_engine(settings.database)) as session:
        quota = session.get(TenantQuota, tenant)
        assert quota is not None and quota.budget_held
    assert not claim(settings, queued)
    assert "device-hours" in (detail(settings, queued)[1] or "")
    assert release_budgets(settings.database, lambda *_: None) == []  # still spent
    with Session(get_engine(settings.database)) as session:  # a day later: the use left the window
        for attempt in session.exec(select(JobAttempt)).all():
            attempt.started_at -= 24 * HOUR_S
            attempt.ended_at = (attempt.ended_at or 0) - 24 * HOUR_S
            session.add(attempt)
        session.commit()
    assert release_budgets(settings.database, lambda *_: None) == [queued]
    with Session(get_engine(settings.database)) as session:
        quota = session.get(TenantQuota, tenant)
        assert quota is not None and not quota.budget_held
    assert next_queued(settings.database, 1) == queued
