"""Finding jobs whose worker died: a job is never left `running` after its worker is gone.

A launched job is lost when its heartbeat is older than `stale_after_s` and its worker process is
gone. Whether the process is gone can be seen only on the worker's host; from another host a stale
heartbeat is enough. A lost job is failed with `worker_lost`; when it ran on this host and the
process group of its running phase is still alive (the worker was killed, its ranks were not), the
group is killed too, so no orphan holds a device. Whatever the phase (profile, distill, finalize),
the worker records its torchrun or process as the job's pid, and it names the job's run directory on
its command line. The API runs this periodically; every worker runs it at start-up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time

import psutil
from sqlmodel import col, select

from app.core.database import session_scope
from app.core.lifecycle import ACTIVE, FAILED, transition
from app.core.tables import Job

LOST_MESSAGE = "the worker {worker} stopped sending heartbeats ({age:.0f} s) while the job was {state}{phase}"


def kill_orphans(job: Job) -> list[int]:
    """Kill the job's torchrun process group (training or profiling) when it lives on this host; returns
    the pids found."""
    if job.pid is None or job.host != socket.gethostname():
        return []
    try:
        leader = psutil.Process(job.pid)
        members = [leader, *leader.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    if job.run_dir and not any(job.run_dir in " ".join(p.cmdline()) for p in members if p.is_running()):
        return []  # the pid was reused by an unrelated process
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(job.pid, signal.SIGKILL)
    for member in members:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    psutil.wait_procs(members, timeout=5)
    return [member.pid for member in members]


def worker_alive(job: Job) -> bool:
    """Whether the job's worker process still runs (only knowable on its host)."""
    if job.worker_pid is None or job.host != socket.gethostname():
        return False
    try:
        process = psutil.Process(job.worker_pid)
        # a pid reused by a later process is not the worker
        return process.create_time() <= (job.started_at or 0) + 1 and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def reap_lost_jobs(database: str, stale_after_s: float) -> list[int]:
    """Fail every launched job without a recent heartbeat; returns their ids."""
    cutoff = time.time() - stale_after_s
    reaped = []
    with session_scope(database) as session:
        candidates = session.exec(select(Job).where(col(Job.state).in_(sorted(ACTIVE)))).all()
        stale = [job for job in candidates if (job.heartbeat_at or job.updated_at) < cutoff and not worker_alive(job)]
    for job in stale:
        assert job.id is not None
        with session_scope(database) as session:
            fresh = session.get(Job, job.id)
            if fresh is None or fresh.state not in ACTIVE or (fresh.heartbeat_at or fresh.updated_at) >= cutoff:
                continue  # it ended or its worker spoke meanwhile
            age = time.time() - (fresh.heartbeat_at or fresh.updated_at)
            phase = f" (phase {fresh.phase})" if fresh.phase else ""
            message = LOST_MESSAGE.format(worker=fresh.worker or "?", age=age, state=fresh.state, phase=phase)
            if not transition(session, job.id, FAILED, [fresh.state], termination_reason="worker_lost", error=message):
                continue
        kill_orphans(fresh)
        reaped.append(job.id)
    return reaped
