"""Running one job on this node: claim, prepare, run its phases under the supervisor, record the outcome.

claim      compare-and-set queued -> starting (a job is launched at most once, whoever else got it); this
           opens the job's next attempt (app/core/attempts.py); a sweep's child is claimed only while its
           sweep has fewer than `max_parallel` children launched (app/core/sweeps.py), a tenant's job only
           while its quota allows (app/core/quotas.py), and when the job leaves this worker what it held
           back is woken (app/core/priority.py `wake_held`)
prepare    the engine's prepare_run checks the spec, data, workload and a plan without profiling, and
           writes the run directory's spec.json and phases.json; a job that ran before (resumed, or
           restarted) keeps its run directory: the phases not yet done run again and every block
           continues from its last checkpoint (the attempt records where); -> running
phases     pipebd_core.job.supervisor runs profile, plan, distill, finalize, exactly as `pipebd run` does;
           this module's watcher, on every poll: telemetry and log growth into the database (a phase's
           processes are recorded as the job's pid, so the reaper can kill them if this worker dies),
           heartbeats, the job's state (cancel requests), the worker shutting down; each phase change
           is stored on the job and as a `phase` event, with a `phase.finished` webhook delivery for each
           phase that ended (app/core/webhooks.py), and wakes the job's MLflow export where
           PIPEBD_MLFLOW_URI is set (worker/tracking.py: a thread of its own, never the job's failure)
outcome    succeeded, or failed with a reason (rank_error with the first rank's traceback, oom,
           exit_code, timeout, worker_lost, launch_error), or cancelled; paused (a pause request: the
           ranks saved every block at a step boundary); requeued, to resume on any worker that fits it,
           after a fault of the machine (its termination is retryable, pipebd_core/job/outcomes.py; up to
           the job's max_restarts) or when this worker shuts down: one decision, app/core/lifecycle.py `settle`,
           shared with the reaper
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Unpack

from sqlalchemy import update
from sqlmodel import Session, col

from app.core import gangs
from app.core.attempts import record_plan, record_resume, record_shape
from app.core.database import DATABASE_DOWN, persist, session_scope, write_lock
from app.core.job_phases import PhaseEntry, phase_entries
from app.core.lifecycle import JobChanges, settle, transition
from app.core.plan_summary import cut, summarize
from app.core.priority import wake_held
from app.core.quotas import claim_quota
from app.core.registry import register_job
from app.core.settings import Settings
from app.core.states import (
    ACTIVE,
    CANCELLED,
    CANCELLING,
    FAILED,
    FINAL,
    PAUSED,
    PAUSING,
    QUEUED,
    RUNNING,
    STARTING,
    SUCCEEDED,
)
from app.core.sweeps import claim_room, lock_sweep_of
from app.core.tables import Job, JobEvent, now
from app.core.webhooks import notify_phases
from pipebd_core.distill.plan import Plan
from pipebd_core.documents.base import DocumentError
from pipebd_core.documents.errors import PlanError
from pipebd_core.documents.phases import PhaseRecord, current
from pipebd_core.job.elastic import reshape
from pipebd_core.job.forked import PhaseProcess
from pipebd_core.job.isolated import StepFailed
from pipebd_core.job.launch import prepare_run
from pipebd_core.job.nodes import NodeRole
from pipebd_core.job.supervisor import Outcome, Stop, Supervisor, Watcher
from pipebd_core.rundir import RunDir
from pipebd_core.spec import SpecError, parse_spec
from worker.streaming import Progress, TakenOver, TelemetryStreamer
from worker.tracking import MlflowExport, start_export

log = logging.getLogger("pipebd.worker")


def current_state(database: str, job_id: int) -> str | None:
    with session_scope(database) as session:
        job = session.get(Job, job_id)
        return None if job is None else job.state


class PhaseEvent(Progress):
    """The data of a job's `phase` event (and the columns it sets): the phase now, every phase, the progress."""

    phase: str
    phases: list[PhaseEntry]


Publish = Callable[[int, str], None]  # (job id, queue): put a requeued job's id on the broker


def resumed_from(run_dir: RunDir) -> list[int] | None:
    """The step each block resumes from, as the ranks will compute it; None before the run was planned."""
    if not run_dir.plan.exists():
        return None
    plan = Plan.from_document(run_dir.load_plan())
    return run_dir.checkpoints.resume_steps(plan.num_blocks, common=plan.is_pipeline)


def free_run_dir(runs: Path, job_id: int) -> Path:
    path = runs / f"job-{job_id}"
    return path if not path.exists() else runs / f"job-{job_id}-{int(time.time())}"


class JobWatcher(Watcher):
    """The worker's side of the supervisor: telemetry, heartbeats, phases and cancel requests.

    While the database does not answer, the ranks keep running: what could not be stored (telemetry,
    a phase change, a process id) is stored on the first poll after it answers again. Each of these writes
    happens only while the run still holds the job (`JobRunner.holds`, on the locked row): a run whose job was
    reaped and claimed again elsewhere writes none of them, and stops at its next poll."""

    def __init__(self, runner: JobRunner, run_dir: RunDir, nproc: int, export: MlflowExport | None = None) -> None:
        self.runner, self.run_dir, self.export = runner, run_dir, export
        self.database, self.job_id = runner.database, runner.job_id
        self.streamer = TelemetryStreamer(self.database, self.job_id, run_dir, nproc, runner.holds)
        self.records: list[PhaseRecord] = []
        self.unsaved: dict[str, Callable[[], None]] = {}  # what to store once the database answers, by kind
        self.outage_since: float | None = None

    def _store(self, kind: str, write: Callable[[], None]) -> None:
        """Run a database write now, or keep it (the newest of its kind) for when the database answers."""
        self.unsaved[kind] = write
        try:
            write()
        except DATABASE_DOWN as error:
            self._outage(error)
            return
        del self.unsaved[kind]

    def _outage(self, error: Exception) -> None:
        if self.outage_since is None:
            self.outage_since = time.time()
            log.warning("job %s: the database does not answer (%s); the ranks keep running", self.job_id, error)

    def phases_changed(self, records: list[PhaseRecord]) -> None:
        self.records = records
        if self.export is not None:
            self.export.update()  # its own thread; the job never waits on the tracking server
        self._store("phases", functools.partial(self._save_phases, [r.model_copy() for r in records]))

    def _save_phases(self, records: list[PhaseRecord]) -> None:
        now_running = current(records)
        name = now_running.name if now_running else records[-1].name
        progress = self.streamer.progress(name, records)
        data: PhaseEvent = {"phase": name, "phases": phase_entries(records), **progress}
        fields = dict(data)
        summary = summarize(self.run_dir.load_plan()) if self.run_dir.plan.exists() else None
        if summary is not None:
            fields["plan_summary"] = summary
        with session_scope(self.database) as session:
            if not self.runner.holds(session):
                log.warning("job %s: claimed again elsewhere; this run's phases are not stored", self.job_id)
                return
            if summary is not None:  # the attempt's plan: an elastic job's differs between attempts
                record_plan(session, self.job_id, cut(summary))
            stored = session.get(Job, self.job_id)
            before = None if stored is None else stored.phases
            session.execute(update(Job).where(col(Job.id) == self.job_id).values(**fields))
            session.add(JobEvent(job_id=self.job_id, kind="phase", data=dict(data)))
            notify_phases(session, self.job_id, before, records)

    def process_changed(self, phase: str, process: PhaseProcess | None) -> None:
        pid = process.pid if process is not None else None
        self._store("pid", functools.partial(self._save_pid, pid))

    def _save_pid(self, pid: int | None) -> None:
        with session_scope(self.database) as session:
            if not self.runner.holds(session):
                log.warning("job %s: claimed again elsewhere; this run's process id is not stored", self.job_id)
                return
            session.execute(update(Job).where(col(Job.id) == self.job_id).values(pid=pid))

    def tick(self, phase: str) -> Stop | None:
        try:
            for kind in list(self.unsaved):
                self.unsaved[kind]()
                del self.unsaved[kind]
            state, owned = self.runner.standing()
            if owned:
                self.streamer.poll(phase, self.records)
                self.runner.heartbeat()
        except DATABASE_DOWN as error:
            self._outage(error)
            return None
        except TakenOver:
            owned = False
        if self.outage_since is not None:
            log.warning("job %s: the database answers again after %.0f s", self.job_id, time.time() - self.outage_since)
            self.outage_since = None
        if state in ACTIVE and not owned:  # reaped while this worker ran it (stale heartbeats), claimed again
            return Stop("failed", "worker_lost", "the job was claimed again by another worker: this run stops")
        if state == CANCELLING:
            return Stop("cancelled", "user_cancelled")
        lost = self.runner.lost_node()
        if lost is not None:
            return Stop("failed", "node_lost", lost)
        if state is None or state not in ACTIVE:  # deleted, or ended or requeued by the reaper: just stop
            return Stop("failed", "worker_lost", f"the job was ended elsewhere ({state or 'deleted'})")
        if state == PAUSING:
            return Stop("cancelled", "user_paused", f"paused during the {phase} phase", checkpoint=True)
        leaving = self.runner.leaving_node()
        if self.runner.shutdown.is_set() or leaving is not None:
            worker = self.runner.settings.worker_name
            message = leaving or f"the worker {worker} was shut down during the {phase} phase"
            grace = self.runner.settings.preempt_grace_s
            return Stop("cancelled", "worker_shutdown", message, checkpoint=True, grace_s=grace)
        return None

    def drain(self, phase: str) -> None:
        patience = self.runner.settings.outage_patience_s
        try:
            persist(lambda: self.streamer.poll(phase, self.records), patience, f"job {self.job_id}: telemetry")
        except TakenOver as error:
            log.warning("job %s: telemetry not stored: %s", self.job_id, error)


class JobRunner:
    """Runs job `job_id` to a final state; every exit path leaves no process behind.

    `shutdown` is set when the worker is asked to stop: the ranks save every block at a step boundary
    and the job goes back to the queue (a job not yet claimed stays there). `publish` puts a requeued
    job's id back on the broker."""

    def __init__(
        self,
        job_id: int,
        settings: Settings,
        shutdown: threading.Event,
        extra_env: dict[str, str] | None = None,
        publish: Publish | None = None,
    ) -> None:
        self.job_id = job_id
        self.settings = settings
        self.database = settings.database
        self.shutdown = shutdown
        self.extra_env = extra_env or {}
        self.publish = publish
        self.last_heartbeat = 0.0
        self.claimed_at: float | None = None  # the claim's stamp (the job's started_at): see `owns`

    def run(self) -> str:
        """The job's state when this worker is done with it, or 'not claimed' when it was not queued
        (another worker, cancelled, paused) or this worker is shutting down (the job stays queued)."""
        if self.shutdown.is_set():
            self.republish()
            return "not claimed"
        if not self.claim():
            return "not claimed"
        try:
            return self.run_claimed()
        finally:
            self.wake_held()

    def wake_held(self) -> None:
        """The job left this worker: a waiting child of its sweep, or a job its tenant's quota held, may start
        now (app/core/priority.py)."""
        try:
            wake_held(self.database, self.job_id, self.publish)
        except Exception:  # the broker or database is down: the reaper's and later ends' wakes still come
            log.exception("job %s: could not wake the jobs it held back", self.job_id)

    def run_claimed(self) -> str:
        try:
            run_dir = self.prepare()
            if run_dir is None:
                return current_state(self.database, self.job_id) or "deleted"
            return self.run_phases(run_dir)
        except Exception as error:
            log.exception("job %s: the worker failed", self.job_id)
            message = f"the worker failed while running the job: {type(error).__name__}: {error}"
            expected = [STARTING, RUNNING, CANCELLING]
            try:
                self.move(FAILED, expected, termination_reason="launch_error", error=message)
            except TakenOver as lost:
                log.warning("job %s: its failure is not recorded: %s", self.job_id, lost)
                return current_state(self.database, self.job_id) or "deleted"
            return FAILED

    def claim(self) -> bool:
        stamp = now()
        fields: JobChanges = {
            "worker": self.settings.worker_name,
            "host": self.settings.host_id,
            "worker_pid": os.getpid(),
            "started_at": stamp,
            "heartbeat_at": stamp,
        }
        # the sweep's and the tenant's rows stay locked until this commits (always in this order)
        with session_scope(self.database) as session:
            claimed = (
                claim_room(session, self.job_id)
                and claim_quota(session, self.job_id)
                and transition(session, self.job_id, STARTING, [QUEUED], **fields)
            )
        self.claimed_at = stamp if claimed else None
        return claimed

    def owns(self, job: Job | None) -> bool:
        """Whether the job's row still names this worker's claim. The reaper requeues a job whose heartbeats went
        stale (a database outage, a stalled machine), and another worker may claim it while this one still runs
        it: then this run must store, record and settle nothing more."""
        return (
            job is not None
            and self.claimed_at is not None
            and job.worker == self.settings.worker_name
            and job.worker_pid == os.getpid()
            and job.started_at is not None
            and abs(job.started_at - self.claimed_at) < 1e-3
        )

    def holds(self, session: Session) -> bool:
        """Whether this run may still write the job's row (its preparation, telemetry, phases, process id, its end;
        through `fenced`): the row, locked until `session` commits, names its claim (`owns`). A runner that made no
        claim (a test's own, driving a job it moved itself) always may."""
        if self.claimed_at is None:
            return True
        return self.owns(write_lock(session, Job, self.job_id))

    @contextmanager
    def fenced(self, ending: bool = False) -> Iterator[Session]:
        """A transaction that writes the job's row or its open attempt only while this run holds the job (`holds`):
        raises TakenOver, nothing written, once the job was claimed again elsewhere (or deleted). `ending`: the
        transaction may end the job, so the row of its sweep is locked first (app/core/sweeps.py `lock_sweep_of`:
        the sweep's row before the job's, as every transaction that touches both takes them)."""
        with session_scope(self.database) as session:
            if ending:
                lock_sweep_of(session, self.job_id)
            if not self.holds(session):
                raise TakenOver(f"job {self.job_id} is no longer this run's: claimed again elsewhere (or deleted)")
            yield session

    def move(self, target: str, expected: list[str], **fields: Unpack[JobChanges]) -> bool:
        """Move the job from one of `expected` to `target` (app/core/lifecycle.py `transition`) while this run holds
        it; False when it was in none of them; TakenOver when it is no longer this run's."""
        with self.fenced(ending=target in FINAL) as session:
            return transition(session, self.job_id, target, expected, **fields)

    def standing(self) -> tuple[str | None, bool]:
        """The job's state (None: deleted) and whether it is still this worker's claim."""
        with session_scope(self.database) as session:
            job = session.get(Job, self.job_id)
            return (None if job is None else job.state), self.owns(job)

    def node_role(self) -> NodeRole | None:
        """This worker's part when the job spans several nodes (worker/gang.py); None: the job is all here."""
        return None

    def lost_node(self) -> str | None:
        """Another node of the job that went silent, in words (worker/gang.py); never on one node."""
        return None

    def leaving_node(self) -> str | None:
        """Another node of the job whose worker was told to stop, in words (worker/gang.py); never on one node."""
        return None

    def free_nodes(self) -> int:
        """How many more hosts could join this job now (pipebd_core/job/grow.py); 0 while the database is down."""
        try:
            with session_scope(self.database) as session:
                job = session.get(Job, self.job_id)
                if job is None:
                    return 0
                seen_after = now() - 3 * self.settings.heartbeat_s  # a worker that missed beats is not offered
                return gangs.free_hosts(session, job, self.job_hosts(session), seen_after)
        except DATABASE_DOWN:
            return 0

    def job_hosts(self, session: Session) -> list[str]:
        """The hosts the job runs on now: this one (a gang's node 0 names every seat's, worker/gang.py)."""
        return [self.settings.host_id]

    def heartbeat(self, force: bool = False) -> None:
        if force or time.time() - self.last_heartbeat >= self.settings.heartbeat_s:
            with session_scope(self.database) as session:  # only while the job is this worker's (`owns`)
                ours = (col(Job.id) == self.job_id, col(Job.worker) == self.settings.worker_name)
                session.execute(update(Job).where(*ours, col(Job.worker_pid) == os.getpid()).values(heartbeat_at=now()))
            self.last_heartbeat = time.time()

    def republish(self) -> None:
        """Put the job's id back on the broker (the message that brought it here is done)."""
        if self.publish is None:
            return
        with session_scope(self.database) as session:
            job = session.get(Job, self.job_id)
            queue = None if job is None or job.state != QUEUED else job.queue
        if queue is not None:
            self.publish(self.job_id, queue)

    def prepare(self) -> RunDir | None:
        """The run directory with spec.json and phases.json, the job then `running`; None when the job
        cannot run (failed as launch_error), ended meanwhile (cancelled, paused, deleted) or is no longer this
        run's (claimed again elsewhere: then it writes neither the job's row nor its attempt; taken over after
        its first read, it may still have written into the run directory: a `resumed` event and a re-plan, or a
        `job-<id>` folder the next claim passes by). A job that ran before continues in its own run directory."""
        try:
            with self.beating():
                return self._prepare()
        except TakenOver as error:
            log.warning("job %s: not prepared: %s", self.job_id, error)
            return None

    @contextmanager
    def beating(self) -> Iterator[None]:
        """Heartbeats from a thread while the block runs: a preparation that builds a large workload (a language
        model's, on a loaded machine) outlasts the reaper's stale bound, and the reaper took the job from the live
        worker preparing it, again and again (found by the soak, issue 42). The supervisor's watcher beats after."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.settings.heartbeat_s):
                try:
                    self.heartbeat(force=True)
                except DATABASE_DOWN:
                    continue  # the next beat tries again

        thread = threading.Thread(target=beat, name=f"beat-job-{self.job_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def _prepare(self) -> RunDir | None:
        with self.fenced() as session:
            job = session.get(Job, self.job_id)
            assert job is not None
            spec, previous, nodes = parse_spec(job.spec), job.run_dir, job.nodes
        try:
            if previous is not None and RunDir(Path(previous)).phases.exists():
                run_dir = RunDir(Path(previous))
                run_dir.append_event("resumed")
                steps = resumed_from(run_dir) or []
                reshape(run_dir, nodes)  # an elastic job on fewer nodes than before: re-planned for them
                with self.fenced() as session:
                    record_resume(session, self.job_id, steps)
            else:
                if nodes != spec.schedule.nodes:  # an elastic job started on fewer nodes (app/core/gangs.py `release`)
                    spec = spec.model_copy(update={"schedule": spec.schedule.on_nodes(nodes)})
                run_dir = prepare_run(spec, free_run_dir(self.settings.runs, self.job_id), isolate=True)
            with self.fenced() as session:
                record_shape(session, self.job_id, nodes, spec.schedule.nproc)
        except (SpecError, PlanError, DocumentError, StepFailed) as error:  # DocumentError: an older PipeBD's plan.json
            self.move(FAILED, [STARTING], termination_reason="launch_error", error=str(error))
            return None
        with self.fenced() as session:  # the run directory, in the transaction that starts the job
            session.execute(update(Job).where(col(Job.id) == self.job_id).values(run_dir=str(run_dir.root)))
            if transition(session, self.job_id, RUNNING, [STARTING]):
                return run_dir
        state = current_state(self.database, self.job_id)
        if state == CANCELLING:
            self.move(CANCELLED, [CANCELLING], termination_reason="user_cancelled")
        elif state == PAUSING:
            self.move(PAUSED, [PAUSING], termination_reason="user_paused")
        return None

    def run_phases(self, run_dir: RunDir) -> str:
        nproc = run_dir.load_spec().schedule.world_size  # every node's ranks write into this run directory
        with session_scope(self.database) as session:
            stored = session.get(Job, self.job_id)
            sweep_id = None if stored is None else stored.sweep_id
        export = start_export(self.settings, self.job_id, run_dir, sweep_id)  # None without PIPEBD_MLFLOW_URI
        supervisor = Supervisor(
            run_dir,
            JobWatcher(self, run_dir, nproc, export),
            poll_s=self.settings.poll_s,
            kill_grace_s=self.settings.kill_grace_s,
            time_limit_s=self.settings.job_timeout_s,
            extra_env=self.extra_env,
            node=self.node_role(),
            isolate=True,  # this process lives on: it never builds a network or loads a data set itself
            free_nodes=self.free_nodes,  # an elastic job below its max_nodes is offered free hosts (grow.py)
        )
        state = FAILED  # unless the supervisor returns and the end is recorded
        try:
            outcome = supervisor.run()
            # the ranks are gone; the database may not answer yet (a restart): record the end once it does
            patience = self.settings.outage_patience_s
            if outcome.result == SUCCEEDED:  # registered before the job shows succeeded: then its models are there
                self.register_models(export)
            state = persist(lambda: self.finish(outcome), patience, f"job {self.job_id}: its end")
        finally:
            if export is not None:  # after the job's end is recorded: a down tracking server delays only the next job
                export.close(state)
        return state

    def register_models(self, export: MlflowExport | None) -> None:
        """Register the models the job wrote (app/core/registry.py; idempotent: a retried job adds none twice),
        and hand them to the MLflow export; a failure is logged, never the job's."""
        try:
            with session_scope(self.database) as session:
                job = session.get(Job, self.job_id)
                models = [] if job is None else register_job(session, job)
                if export is not None:
                    export.register_models([model.id for model in models if model.id is not None])
        except Exception:
            log.exception("job %s: could not register its models", self.job_id)

    def finish(self, outcome: Outcome) -> str:
        """Record how this run of the job ended (app/core/lifecycle.py `settle`: paused, requeued after a
        shutdown or a fault of the machine with restarts left, or its own end); a job that ended elsewhere
        meanwhile (deleted, reaped) keeps that end."""
        try:
            with self.fenced(ending=True) as session:
                settled = settle(
                    session,
                    self.job_id,
                    outcome.result,
                    outcome.termination,
                    server_max_restarts=self.settings.max_restarts,
                    exit_code=outcome.exit_code,
                    grow_to=outcome.grow_to,
                )
        except TakenOver as error:
            log.warning("job %s: this run's end is not recorded: %s", self.job_id, error)
            return current_state(self.database, self.job_id) or "deleted"
        if settled is not None and settled.state == QUEUED:
            log.warning("job %s requeued (%s)", self.job_id, outcome.reason)
            if self.publish is not None:
                self.publish(self.job_id, settled.queue)
        return current_state(self.database, self.job_id) or "deleted"
