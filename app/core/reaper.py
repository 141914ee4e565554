"""Finding jobs whose worker died: a job is never left `running` after its worker is gone.

A launched job is lost when its worker process is visibly gone (on the worker's host: at once) or,
seen from another host, when its heartbeat is older than `stale_after_s`. When it ran on this host
and the process group of its running phase is still alive (the worker was killed, its ranks were
not), the group is killed, so no orphan holds a device. Whatever the phase (profile, distill,
finalize), the worker records its torchrun or process as the job's pid, and it names the job's run
directory on its command line. Then:

    its run completed meanwhile (summary.json and the final weights written after the job started)
                                              -> succeeded
    it has automatic restarts left            -> queued again (worker_lost), to resume from its checkpoints
    otherwise                                 -> failed: worker_lost

The API runs this periodically; every worker runs it at start-up.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from sqlmodel import col, select

from app.core.database import session_scope
from app.core.lifecycle import ACTIVE, CANCELLING, FAILED, PAUSED, PAUSING, RUNNING, SUCCEEDED, requeue, transition
from app.core.tables import Job

FINAL_OUTPUTS = (("student.pt", "finetuned_model.pt"), ("summary.json",))  # one of each, as the last phase writes

LOST_MESSAGE = "the worker {worker} stopped sending heartbeats ({age:.0f} s) while the job was {state}{phase}"
DIED_MESSAGE = "the worker {worker} (pid {pid} on this host) died while the job was {state}{phase}"


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


def visibly_gone(job: Job) -> bool:
    """Whether this host can see that the job's worker process no longer runs."""
    return job.worker_pid is not None and job.host == socket.gethostname() and not worker_alive(job)


def completed(job: Job) -> bool:
    """Whether the job's run finished while nobody watched: its final outputs are there, written after it
    started, and its summary reads."""
    if job.run_dir is None:
        return False
    root = Path(job.run_dir)
    for names in FINAL_OUTPUTS:
        found = [root / name for name in names if (root / name).is_file() and (root / name).stat().st_size > 0]
        if not found or found[0].stat().st_mtime < (job.started_at or 0):
            return False
    try:
        json.loads((root / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return True


Publish = Callable[[int, str], None]  # (job id, queue): put a requeued job's id on the broker


def reap_lost_jobs(
    database: str, stale_after_s: float, publish: Publish | None = None, max_restarts: int = 0
) -> list[int]:
    """Settle every launched job whose worker is gone (see above); returns their ids. Without `publish`
    a lost job is never requeued; `max_restarts` is the budget of jobs whose spec gives none."""
    cutoff = time.time() - stale_after_s

    def lost(job: Job) -> bool:
        return visibly_gone(job) or ((job.heartbeat_at or job.updated_at) < cutoff and not worker_alive(job))

    reaped = []
    with session_scope(database) as session:
        candidates = session.exec(select(Job).where(col(Job.state).in_(sorted(ACTIVE)))).all()
        stale = [job for job in candidates if lost(job)]
    for job in stale:
        assert job.id is not None
        with session_scope(database) as session:
            fresh = session.get(Job, job.id)
            if fresh is None or fresh.state not in ACTIVE or not lost(fresh):
                continue  # it ended or its worker spoke meanwhile
        kill_orphans(fresh)
        if settle(database, fresh, publish, max_restarts):
            reaped.append(job.id)
    return reaped


def settle(database: str, job: Job, publish: Publish | None, max_restarts: int) -> bool:
    """Record a lost job's end (its processes are gone): succeeded, requeued or failed."""
    assert job.id is not None
    age = time.time() - (job.heartbeat_at or job.updated_at)
    phase = f" (phase {job.phase})" if job.phase else ""
    template = DIED_MESSAGE if visibly_gone(job) else LOST_MESSAGE
    message = template.format(worker=job.worker or "?", pid=job.worker_pid, age=age, state=job.state, phase=phase)
    budget = max_restarts if job.max_restarts is None else job.max_restarts
    with session_scope(database) as session:
        if job.state == PAUSING:  # its ranks are gone, its checkpoints stay: as paused as it will be
            return transition(session, job.id, PAUSED, [PAUSING], termination_reason="user_paused", pid=None)
        if job.state in (RUNNING, CANCELLING) and completed(job):
            fields: dict[str, Any] = {"progress": 1.0, "phase_progress": 1.0, "exit_code": 0, "pid": None}
            return transition(session, job.id, SUCCEEDED, [job.state], **fields)
        if publish is not None and job.restarts < budget and job.state != CANCELLING:
            if not requeue(session, job.id, [job.state], "worker_lost", restarts=job.restarts + 1):
                return False
        else:
            return transition(session, job.id, FAILED, [job.state], termination_reason="worker_lost", error=message)
    publish(job.id, job.queue)
    return True
