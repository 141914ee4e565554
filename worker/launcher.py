"""Running one job on this node: claim, prepare, launch torchrun, follow, stop, record the outcome.

claim      compare-and-set queued -> starting (a job is launched at most once, whoever else got it)
prepare    the engine's prepare_run writes spec.json and plan.json (profiling first when asked);
           heartbeats continue meanwhile; a profiling torchrun runs in its own session under the run
           directory, is recorded as the job's pid (so the reaper can kill it if this worker dies)
           and is stopped at once on cancel, deletion or shutdown
launch     torchrun in its own session (one process group for the whole job), -> running
follow     every poll: telemetry and logs into the database, the job's state (cancel requests),
           heartbeats, the wall-clock limit, the worker shutting down
stop       SIGTERM to the torchrun agent, SIGKILL to every descendant still alive after a grace period
outcome    succeeded, or failed with a reason (rank_error with the first rank's traceback, oom,
           exit_code, timeout, worker_lost), or cancelled
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from sqlalchemy import update
from sqlmodel import col

from app.core.database import session_scope
from app.core.lifecycle import (
    ALLOWED_MOVES,
    CANCELLED,
    CANCELLING,
    FAILED,
    FINAL,
    QUEUED,
    RUNNING,
    STARTING,
    SUCCEEDED,
    transition,
)
from app.core.settings import Settings
from app.core.tables import Job, now
from pipebd_core.launch import prepare_run, start_ranks
from pipebd_core.plan import Plan
from pipebd_core.planning.profiles import ProfilingWatch, watch_profiling
from pipebd_core.processes import stop_process_tree
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, parse_spec
from worker.diagnosis import diagnose
from worker.streaming import TelemetryStreamer

SHUTDOWN = threading.Event()  # set when the worker is asked to stop: running jobs end as worker_lost
log = logging.getLogger("pipebd.worker")


def record(database: str, job_id: int, **fields: Any) -> None:
    """Update fields that are not the state (heartbeat, pid, plan summary)."""
    with session_scope(database) as session:
        session.execute(update(Job).where(col(Job.id) == job_id).values(**fields))


def current_state(database: str, job_id: int) -> str | None:
    with session_scope(database) as session:
        job = session.get(Job, job_id)
        return None if job is None else job.state


def move(database: str, job_id: int, target: str, expected: list[str], **fields: Any) -> bool:
    with session_scope(database) as session:
        return transition(session, job_id, target, expected, **fields)


def plan_summary(plan: dict[str, Any]) -> dict[str, Any]:
    keys = ("mode", "nproc", "num_blocks", "batch_size", "stages", "assignment", "total_steps", "block_names")
    summary = {key: plan.get(key) for key in keys}
    summary.update({key: plan[key] for key in ("predicted_step_s", "mode_step_s") if key in plan})
    return summary


def free_run_dir(runs: Path, job_id: int) -> Path:
    path = runs / f"job-{job_id}"
    return path if not path.exists() else runs / f"job-{job_id}-{int(time.time())}"


class JobRunner:
    """Runs job `job_id` to a final state; every exit path leaves no process behind."""

    def __init__(self, job_id: int, settings: Settings, extra_env: dict[str, str] | None = None) -> None:
        self.job_id = job_id
        self.settings = settings
        self.database = settings.database
        self.extra_env = extra_env or {}
        self.last_heartbeat = 0.0
        self.profiler: subprocess.Popen[bytes] | None = None  # the profiling torchrun while one runs

    def run(self) -> str:
        """The job's final state, or 'not claimed' when it was not queued (another worker, cancelled)."""
        if not self.claim():
            return "not claimed"
        try:
            run_dir = self.prepare()
            if run_dir is None:
                return current_state(self.database, self.job_id) or "deleted"
            return self.launch_and_follow(run_dir)
        except Exception as error:
            log.exception("job %s: the worker failed", self.job_id)
            message = f"the worker failed while running the job: {type(error).__name__}: {error}"
            move(
                self.database,
                self.job_id,
                FAILED,
                [STARTING, RUNNING, CANCELLING],
                termination_reason="launch_error",
                error=message,
            )
            return FAILED

    def claim(self) -> bool:
        stamp = now()
        fields = {
            "worker": self.settings.worker_name,
            "host": socket.gethostname(),
            "worker_pid": os.getpid(),
            "started_at": stamp,
            "heartbeat_at": stamp,
        }
        return move(self.database, self.job_id, STARTING, [QUEUED], **fields)

    def heartbeat(self, force: bool = False) -> None:
        if force or time.time() - self.last_heartbeat >= self.settings.heartbeat_s:
            record(self.database, self.job_id, heartbeat_at=now())
            self.last_heartbeat = time.time()

    def prepare(self) -> RunDir | None:
        """prepare_run in a thread while heartbeating; None when the job ended meanwhile (cancel, failure).

        A profiling job is stopped as soon as the job is cancelled or deleted or the worker shuts down.
        """
        with session_scope(self.database) as session:
            job = session.get(Job, self.job_id)
            assert job is not None
            spec = parse_spec(job.spec)
        path = free_run_dir(self.settings.runs, self.job_id)
        record(self.database, self.job_id, run_dir=str(path))
        with ThreadPoolExecutor(max_workers=1) as pool:
            future: Future[RunDir] = pool.submit(self.prepare_watched, spec, path)
            while not future.done():
                self.heartbeat()
                state = current_state(self.database, self.job_id)
                if state == CANCELLING or state is None or state in FINAL or SHUTDOWN.is_set():
                    self.stop_profiler()
                wait([future], timeout=self.settings.poll_s)
            error = future.exception()
        state = current_state(self.database, self.job_id)
        if state == CANCELLING:
            move(self.database, self.job_id, CANCELLED, [CANCELLING], termination_reason="user_cancelled")
            return None
        if state != STARTING:  # deleted, or failed by the reaper meanwhile
            return None
        if SHUTDOWN.is_set():
            message = f"the worker {self.settings.worker_name} was shut down while the job was starting"
            move(self.database, self.job_id, FAILED, [STARTING], termination_reason="worker_lost", error=message)
            return None
        if error is not None:
            message = f"{type(error).__name__}: {error}"
            move(self.database, self.job_id, FAILED, [STARTING], termination_reason="launch_error", error=message)
            return None
        run_dir = future.result()
        record(self.database, self.job_id, plan_summary=plan_summary(run_dir.read_json(run_dir.plan)))
        return run_dir

    def prepare_watched(self, spec: Spec, path: Path) -> RunDir:
        """prepare_run, its profiling job (if any) in `path`/profiling and known to this runner and the database."""
        watch = ProfilingWatch(path / "profiling", self.profiling_started, self.profiling_ended, self.extra_env)
        with watch_profiling(watch):
            return prepare_run(spec, path)

    def profiling_started(self, process: subprocess.Popen[bytes]) -> None:
        self.profiler = process
        record(self.database, self.job_id, pid=process.pid)

    def profiling_ended(self, process: subprocess.Popen[bytes]) -> None:
        self.profiler = None
        record(self.database, self.job_id, pid=None)

    def stop_profiler(self) -> None:
        profiler = self.profiler
        if profiler is not None and profiler.poll() is None:
            killed = stop_process_tree(profiler, self.settings.kill_grace_s)
            log.info("job %s: stopped its profiling job (%d processes outlived SIGTERM)", self.job_id, len(killed))

    def launch_and_follow(self, run_dir: RunDir) -> str:
        spec = parse_spec(run_dir.read_json(run_dir.spec))
        plan = Plan.from_json(run_dir.read_json(run_dir.plan))
        process = start_ranks(spec, run_dir, self.extra_env)
        record(self.database, self.job_id, pid=process.pid)
        move(self.database, self.job_id, RUNNING, [STARTING])
        streamer = TelemetryStreamer(self.database, self.job_id, run_dir, plan)
        try:
            return self.follow(process, run_dir, streamer)
        finally:
            if process.poll() is None:  # an exception escaped: never leave ranks behind
                stop_process_tree(process, self.settings.kill_grace_s)

    def follow(self, process: subprocess.Popen[bytes], run_dir: RunDir, streamer: TelemetryStreamer) -> str:
        started = time.time()
        limit = self.settings.job_timeout_s
        while process.poll() is None:
            streamer.poll()
            self.heartbeat()
            state = current_state(self.database, self.job_id)
            if state == CANCELLING:
                return self.stop(process, streamer, CANCELLED, "user_cancelled", None)
            if state is None or state in FINAL:  # deleted, or failed by the reaper: just stop
                stop_process_tree(process, self.settings.kill_grace_s)
                return state or "deleted"
            if limit is not None and time.time() - started > limit:
                return self.stop(process, streamer, FAILED, "timeout", f"the job ran longer than {limit:g} s")
            if SHUTDOWN.is_set():
                message = f"the worker {self.settings.worker_name} was shut down while the job ran"
                return self.stop(process, streamer, FAILED, "worker_lost", message)
            time.sleep(self.settings.poll_s)
        streamer.poll()
        return self.finish(process.returncode, run_dir)

    def stop(
        self, process: subprocess.Popen[bytes], streamer: TelemetryStreamer, target: str, reason: str, error: str | None
    ) -> str:
        killed = stop_process_tree(process, self.settings.kill_grace_s)
        if killed:
            log.info("job %s: killed %d processes that outlived SIGTERM", self.job_id, len(killed))
        streamer.poll()
        fields = {"termination_reason": reason, "error": error, "exit_code": process.returncode}
        sources = [state for state in (STARTING, RUNNING, CANCELLING) if target in ALLOWED_MOVES[state]]
        move(self.database, self.job_id, target, sources, **fields)
        return current_state(self.database, self.job_id) or target

    def finish(self, code: int, run_dir: RunDir) -> str:
        if code == 0 and run_dir.summary.exists():
            move(self.database, self.job_id, SUCCEEDED, [RUNNING, CANCELLING], exit_code=0, progress=1.0)
            return SUCCEEDED
        reason, error = diagnose(run_dir, code)
        move(
            self.database,
            self.job_id,
            FAILED,
            [RUNNING, CANCELLING],
            termination_reason=reason,
            error=error,
            exit_code=code,
        )
        return FAILED
