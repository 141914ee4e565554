"""Finding jobs whose worker died: a job is never left `running` after its worker is gone.

A launched job is lost when its worker process is visibly gone (on the worker's host: at once) or,
seen from another host, when its heartbeat is older than `stale_after_s`. When it ran on this host
and the process group of its running phase is still alive (the worker was killed, its ranks were
not), the group is killed, so no orphan holds a device. Whatever the phase (profile, distill,
finalize), the worker records its torchrun or process as the job's pid, and it names the job's run
directory on its command line. Then:

    its run completed meanwhile (its last phase's final weights and summary.json written after the job
    started)                                  -> succeeded
    it was pausing                            -> paused (its checkpoints stay)
    it has automatic restarts left            -> queued again (worker_lost), to resume from its checkpoints
    otherwise                                 -> failed: worker_lost
(app/core/lifecycle.py `settle`, the same decision the worker makes at the end of a run)

The API runs this periodically; every worker runs it at start-up. Both also drop gang seats that no worker
will give up (`reap_stale_seats`, app/core/gangs.py `drop_stale`): those of a job at rest, and those of a
gang past its forming time (`gang_bound_s` + `stale_after_s`), so a seat never keeps a host from gangs for good.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from sqlmodel import col, select

from app.core import gangs
from app.core.database import session_scope
from app.core.lifecycle import settle
from app.core.priority import wake_held
from app.core.states import ACTIVE, CANCELLING, PAUSING, QUEUED, RUNNING
from app.core.tables import Job
from pipebd_core.job.outcomes import FAILED, SUCCEEDED, Result, Termination
from pipebd_core.job.phases import job_phases
from pipebd_core.rundir import RunDir

LOST_MESSAGE = "the worker {worker} stopped sending heartbeats ({age:.0f} s) while the job was {state}{phase}"
DIED_MESSAGE = "the worker {worker} (pid {pid} on this host) died while the job was {state}{phase}"


def kill_orphans(job: Job, here: str) -> list[int]:
    """Kill the job's torchrun process group (training or profiling) when it lives on this host (`here`, its
    host id); returns the pids found."""
    if job.pid is None or job.host != here:
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


def worker_alive(job: Job, here: str) -> bool:
    """Whether the job's worker process still runs (only knowable on its host)."""
    if job.worker_pid is None or job.host != here:
        return False
    try:
        process = psutil.Process(job.worker_pid)
        # a pid reused by a later process is not the worker
        return process.create_time() <= (job.started_at or 0) + 1 and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def visibly_gone(job: Job, here: str) -> bool:
    """Whether this host can see that the job's worker process no longer runs."""
    return job.worker_pid is not None and job.host == here and not worker_alive(job, here)


def completed(job: Job) -> bool:
    """Whether the job's run finished while nobody watched: what its last phase writes (its final weights
    and the summary) is there, written after the job started, and the summary reads."""
    if job.run_dir is None:
        return False
    run_dir = RunDir(Path(job.run_dir))
    try:
        last = job_phases(run_dir.load_spec())[-1]
        outputs = (run_dir.final_weights(last), run_dir.summary)
        if any(path.stat().st_size == 0 or path.stat().st_mtime < (job.started_at or 0) for path in outputs):
            return False
        run_dir.load_summary()
    except (OSError, ValueError):  # ValueError: not JSON, or a DocumentError (an earlier PipeBD's summary)
        return False
    return True


Publish = Callable[[int, str], None]  # (job id, queue): put a requeued job's id on the broker


def reap_lost_jobs(
    database: str,
    stale_after_s: float,
    publish: Publish | None = None,
    max_restarts: int = 0,
    here: str | None = None,
) -> list[int]:
    """Settle every launched job whose worker is gone (see above); returns their ids. Without `publish`
    a lost job is never requeued; `max_restarts` is the budget of jobs whose spec gives none; `here` is this
    host's id as workers record it (`PIPEBD_HOST_ID`, default the host name)."""
    cutoff = time.time() - stale_after_s
    here = here or socket.gethostname()

    def lost(job: Job) -> bool:
        return visibly_gone(job, here) or (
            (job.heartbeat_at or job.updated_at) < cutoff and not worker_alive(job, here)
        )

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
        kill_orphans(fresh, here)
        if settle_lost(database, fresh, publish, max_restarts, here):
            reaped.append(job.id)
    return reaped


def settle_lost(database: str, job: Job, publish: Publish | None, max_restarts: int, here: str) -> bool:
    """Record a lost job's end, its processes gone (app/core/lifecycle.py `settle`): succeeded when its run
    completed meanwhile, else the loss of its worker (paused when it was pausing; requeued with restarts left
    and a broker to publish on; else failed). A job on several nodes loses its gang with node 0's worker: the
    gang is dissolved, so that a restart forms a new one (app/core/gangs.py)."""
    assert job.id is not None
    age = time.time() - (job.heartbeat_at or job.updated_at)
    phase = f" (phase {job.phase})" if job.phase else ""
    template = DIED_MESSAGE if visibly_gone(job, here) else LOST_MESSAGE
    message = template.format(worker=job.worker or "?", pid=job.worker_pid, age=age, state=job.state, phase=phase)
    done = job.state in (RUNNING, CANCELLING, PAUSING) and completed(job)
    result: Result = SUCCEEDED if done else FAILED
    termination = None if done else Termination("worker_lost", message)
    with session_scope(database) as session:
        settled = settle(
            session, job.id, result, termination, server_max_restarts=max_restarts, may_requeue=publish is not None
        )
        if settled is not None:
            gangs.dissolve(session, job.id)
    if settled is not None and settled.state == QUEUED and publish is not None:
        publish(job.id, settled.queue)
    if settled is not None:
        wake_held(database, job.id, publish)  # a sweep's waiting child or its tenant's next job may start now
    return settled is not None


def reap_stale_seats(database: str, forming_limit_s: float) -> list[int]:
    """Drop the gang seats no worker will give up (app/core/gangs.py `drop_stale`); returns their jobs' ids."""
    with session_scope(database) as session:
        dropped = gangs.drop_stale(session, forming_limit_s)
    return sorted({seat.job_id for seat in dropped})
