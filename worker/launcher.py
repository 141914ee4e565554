"""Running one job on this node: claim, prepare, run its phases under the supervisor, record the outcome.

claim      compare-and-set queued -> starting (a job is launched at most once, whoever else got it)
prepare    the engine's prepare_run checks the spec, data, workload and a plan without profiling, and
           writes the run directory's spec.json and phases.json; -> running
phases     pipebd_core.supervisor runs profile, plan, distill, finalize, exactly as `pipebd run` does;
           this module's watcher, on every poll: telemetry and log growth into the database (a phase's
           processes are recorded as the job's pid, so the reaper can kill them if this worker dies),
           heartbeats, the job's state (cancel requests), the worker shutting down; each phase change
           is stored on the job and as a `phase` event
outcome    succeeded, or failed with a reason (rank_error with the first rank's traceback, oom,
           exit_code, timeout, worker_lost, launch_error), or cancelled
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import update
from sqlmodel import col

from app.core.database import session_scope
from app.core.lifecycle import ALLOWED_MOVES, CANCELLING, FAILED, FINAL, QUEUED, RUNNING, STARTING, transition
from app.core.settings import Settings
from app.core.tables import Job, JobEvent, now
from pipebd_core.launch import prepare_run
from pipebd_core.outcomes import SUCCEEDED
from pipebd_core.phases import PhaseRecord, current
from pipebd_core.plan import PlanError
from pipebd_core.rundir import RunDir
from pipebd_core.spec import SpecError, parse_spec
from pipebd_core.supervisor import Outcome, Stop, Supervisor, Watcher
from worker.streaming import TelemetryStreamer

log = logging.getLogger("pipebd.worker")


def record(database: str, job_id: int, **fields: Any) -> None:
    """Update fields that are not the state (heartbeat, pid, plan summary, phases)."""
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


class JobWatcher(Watcher):
    """The worker's side of the supervisor: telemetry, heartbeats, phases and cancel requests."""

    def __init__(self, runner: JobRunner, run_dir: RunDir, nproc: int) -> None:
        self.runner, self.run_dir = runner, run_dir
        self.database, self.job_id = runner.database, runner.job_id
        self.streamer = TelemetryStreamer(self.database, self.job_id, run_dir, nproc)
        self.records: list[PhaseRecord] = []

    def phases_changed(self, records: list[PhaseRecord]) -> None:
        self.records = records
        now_running = current(records)
        name = now_running.name if now_running else records[-1].name
        progress = self.streamer.progress(name, records)
        data: dict[str, Any] = {"phase": name, "phases": [r.to_json() for r in records], **progress}
        fields = dict(data)
        if self.run_dir.plan.exists():
            fields["plan_summary"] = plan_summary(self.run_dir.read_json(self.run_dir.plan))
        with session_scope(self.database) as session:
            session.execute(update(Job).where(col(Job.id) == self.job_id).values(**fields))
            session.add(JobEvent(job_id=self.job_id, kind="phase", data=data))

    def process_changed(self, phase: str, process: subprocess.Popen[bytes] | None) -> None:
        record(self.database, self.job_id, pid=process.pid if process is not None else None)

    def tick(self, phase: str) -> Stop | None:
        self.streamer.poll(phase, self.records)
        self.runner.heartbeat()
        state = current_state(self.database, self.job_id)
        if state == CANCELLING:
            return Stop("cancelled", "user_cancelled")
        if state is None or state in FINAL:  # deleted, or failed by the reaper: just stop
            return Stop("failed", "worker_lost", f"the job was ended elsewhere ({state or 'deleted'})")
        if self.runner.shutdown.is_set():
            worker = self.runner.settings.worker_name
            return Stop("failed", "worker_lost", f"the worker {worker} was shut down during the {phase} phase")
        return None

    def drain(self, phase: str) -> None:
        self.streamer.poll(phase, self.records)


class JobRunner:
    """Runs job `job_id` to a final state; every exit path leaves no process behind.

    `shutdown` is set when the worker is asked to stop: the running phase is stopped and the job ends
    as worker_lost."""

    def __init__(
        self,
        job_id: int,
        settings: Settings,
        shutdown: threading.Event,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.job_id = job_id
        self.settings = settings
        self.database = settings.database
        self.shutdown = shutdown
        self.extra_env = extra_env or {}
        self.last_heartbeat = 0.0

    def run(self) -> str:
        """The job's final state, or 'not claimed' when it was not queued (another worker, cancelled)."""
        if not self.claim():
            return "not claimed"
        try:
            run_dir = self.prepare()
            if run_dir is None:
                return current_state(self.database, self.job_id) or "deleted"
            return self.run_phases(run_dir)
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
        """The run directory with spec.json and phases.json, the job then `running`; None when the job
        cannot run (failed as launch_error) or ended meanwhile (cancelled, deleted)."""
        with session_scope(self.database) as session:
            job = session.get(Job, self.job_id)
            assert job is not None
            spec = parse_spec(job.spec)
        path = free_run_dir(self.settings.runs, self.job_id)
        try:
            run_dir = prepare_run(spec, path)
        except (SpecError, PlanError) as error:
            move(self.database, self.job_id, FAILED, [STARTING], termination_reason="launch_error", error=str(error))
            return None
        record(self.database, self.job_id, run_dir=str(path))
        if move(self.database, self.job_id, RUNNING, [STARTING]):
            return run_dir
        if current_state(self.database, self.job_id) == CANCELLING:
            move(self.database, self.job_id, "cancelled", [CANCELLING], termination_reason="user_cancelled")
        return None

    def run_phases(self, run_dir: RunDir) -> str:
        nproc = parse_spec(run_dir.read_json(run_dir.spec)).schedule.nproc
        supervisor = Supervisor(
            run_dir,
            JobWatcher(self, run_dir, nproc),
            poll_s=self.settings.poll_s,
            kill_grace_s=self.settings.kill_grace_s,
            time_limit_s=self.settings.job_timeout_s,
            extra_env=self.extra_env,
        )
        return self.finish(supervisor.run())

    def finish(self, outcome: Outcome) -> str:
        """Record the job's end; a job that ended elsewhere meanwhile (deleted, reaped) keeps that end."""
        sources = [state for state in (STARTING, RUNNING, CANCELLING) if outcome.result in ALLOWED_MOVES[state]]
        fields: dict[str, Any] = {"pid": None}
        if outcome.result == SUCCEEDED:
            fields.update(progress=1.0, phase_progress=1.0, exit_code=0)
        else:
            fields.update(termination_reason=outcome.reason, error=outcome.error, exit_code=outcome.exit_code)
        move(self.database, self.job_id, outcome.result, sources, **fields)
        return current_state(self.database, self.job_id) or "deleted"
