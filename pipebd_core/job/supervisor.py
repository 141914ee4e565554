"""The one supervisor of a job's phases, for `pipebd run` and for the service's workers alike.

`Supervisor(run_dir, watcher).run()` walks phases.json in order and runs every phase not yet done:
skips what a cache already answers, runs local steps in this process, and starts the processes of
the others (launch.py), polling each until it exits. On every poll it asks its `Watcher` whether to
stop; the CLI's watcher draws a progress line and turns Ctrl-C or SIGTERM into a cancel, the
worker's stores telemetry and heartbeats and reads cancel requests and shutdown. A stop, a wall-clock
limit or an exception always stops the whole process tree before `run` returns, so no process
outlives its phase. Why a process failed comes from `diagnosis.diagnose`.

events.jsonl records, the same way whoever supervises:

    phase_started {phase}      phase_finished {phase, outcome, duration_s, reason}
    finished                   failed {reason, phase, error}          cancelled {reason, phase}

While distillation runs, a `DistillMonitor` calibrates from its telemetry and may re-plan it: the
ranks stop at a step boundary and the phase is launched again under the new plan (replan.py; events
calibrated, replan_requested, replanned). When a training phase ends, whatever its outcome, its
telemetry is written out as TensorBoard event files (pipebd_core/tracking/tensorboard.py; an event
`tensorboard_failed {phase, error}` where they could not be).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from pipebd_core.distill.control import PAUSE, clear_stop, request_stop, stopped_early
from pipebd_core.documents.base import DocumentError
from pipebd_core.documents.distill_plan import Replan
from pipebd_core.documents.errors import PlanError
from pipebd_core.documents.phases import DISTILL, TRAINING_PHASES, PhaseOutcome, PhaseRecord
from pipebd_core.job import launch
from pipebd_core.job.diagnosis import diagnose
from pipebd_core.job.forked import PhaseProcess
from pipebd_core.job.grow import GROWN, FreeNodes
from pipebd_core.job.isolated import StepFailed
from pipebd_core.job.nodes import NodeError, NodeLink, NodeRole
from pipebd_core.job.outcomes import CANCELLED, FAILED, SKIPPED, SUCCEEDED, Result, Termination
from pipebd_core.job.processes import Rendezvous, stop_process_tree
from pipebd_core.job.replan import DistillMonitor
from pipebd_core.planning.profiles import ProfileError
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, SpecError
from pipebd_core.tracking import tensorboard

ERROR_IN_EVENT_CHARS = 2000  # events.jsonl keeps the start of a failure's text; the whole is in errors/


@dataclass(frozen=True)
class Stop:
    """A watcher's request to stop the running phase, and how the job then ends."""

    result: Result  # cancelled or failed
    reason: str  # a termination reason (outcomes.py)
    message: str | None = None
    # True: stop the distill ranks at their next step boundary with every block saved (control.py), so a
    # later run resumes there; other phases are stopped at once (they start again on resume)
    checkpoint: bool = False
    # a checkpoint stop that has not ended the ranks this many seconds after it was asked for stops them at once
    # (a preemption notice: the machine goes away after its grace period); None: wait for the step boundary
    grace_s: float | None = None


@dataclass(frozen=True)
class Outcome:
    """How a job (or one phase) ended: its result and, unless it succeeded, why (its termination record)."""

    result: Result
    termination: Termination | None = None
    exit_code: int | None = None
    phase: str | None = None  # the phase it ended in, when it did not succeed
    grow_to: int | None = None  # stopped to take a larger gang (grow.py): the nodes it resumes on

    @property
    def reason(self) -> str | None:
        return self.termination.reason if self.termination else None

    @property
    def error(self) -> str | None:
        return self.termination.error if self.termination else None


def stopped_outcome(stop: Stop) -> Outcome:
    """How a job ends when a Stop comes while no phase runs (between launches, or before the first)."""
    return Outcome(stop.result, Termination(stop.reason, stop.message))


class Watcher:
    """What the caller does while phases run; every method may be left as it is."""

    def phases_changed(self, records: list[PhaseRecord]) -> None:
        """A phase started or ended (records: every phase, in order)."""

    def process_changed(self, phase: str, process: PhaseProcess | None) -> None:
        """A phase's process started (None: it is gone)."""

    def tick(self, phase: str) -> Stop | None:
        """Called about every `poll_s` while `phase` runs; a Stop ends it."""
        return None

    def drain(self, phase: str) -> None:
        """The phase's process has exited: take in what it wrote last."""

    def replanned(self, entry: Replan) -> None:
        """The distill phase stopped to re-plan and runs again under a new plan (entry: replan.py)."""


class Supervisor:
    def __init__(
        self,
        run_dir: RunDir,
        watcher: Watcher | None = None,
        *,
        poll_s: float = 0.25,
        kill_grace_s: float = 10.0,
        time_limit_s: float | None = None,
        extra_env: dict[str, str] | None = None,
        refresh_profile: bool = False,
        profile_trials: int = launch.PROFILE_TRIALS,
        store_calibration: bool = True,
        node: NodeRole | None = None,
        until: str | None = None,
        isolate: bool = False,
        free_nodes: FreeNodes | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.free_nodes = free_nodes  # hosts free to join an elastic job that may grow (grow.py); None: never offered
        self.isolate = isolate  # the plan phases in a child process (a long-lived worker's supervisor)
        self.until = until  # the last phase to run (a caller that reads the distill checkpoints itself); None: all
        self.watcher = watcher or Watcher()
        self.poll_s, self.kill_grace_s, self.time_limit_s = poll_s, kill_grace_s, time_limit_s
        self.extra_env = extra_env or {}
        self.refresh_profile, self.profile_trials = refresh_profile, profile_trials
        self.store_calibration = store_calibration  # False: calibration stays in the run directory (benchmarks)
        self.spec: Spec = run_dir.load_spec()
        self.records = run_dir.load_phases()
        self.started = time.monotonic()
        # a job on several nodes (nodes.py): this node's link to the others; None on one node
        self.link = NodeLink(run_dir, node) if node is not None and node.nnodes > 1 else None

    def run(self) -> Outcome:
        """Run every phase not yet done, in order; the job's outcome (also appended to events.jsonl). On
        several nodes this is node 0's part; the others run `follow`."""
        assert self.link is None or self.link.role.node == 0, "node k > 0 follows node 0's launches: use follow()"
        current: PhaseRecord | None = None
        try:
            if self.link is not None:
                stopped, stops = self._stopper()
                if not self.link.check_shared(stopped):  # the job ended elsewhere while its nodes gathered
                    return self._end(stopped_outcome(stops[0]))
            for record in self.records:
                if record.done:
                    continue
                current = record
                outcome = self._run_phase(record)
                if outcome.result != SUCCEEDED:
                    return self._end(outcome)
                if record.name == self.until:
                    break
            return self._end(Outcome(SUCCEEDED))
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM turned into one by the CLI; the tree is stopped
            if current is not None and current.state != "ended":
                self._finish_phase(current, CANCELLED, "user_cancelled")
            name = current.name if current else None
            return self._end(Outcome(CANCELLED, Termination("user_cancelled", "interrupted"), phase=name))
        except NodeError as error:
            return self._end(Outcome(FAILED, Termination("launch_error", str(error))))

    def follow(self) -> Outcome:
        """Node k > 0 of a job on several nodes: start this node's part of each of node 0's torchrun launches
        until node 0 ends the job, a launch fails here or on another node, or the watcher stops it. Writes
        nothing of the job's own records (node 0 keeps phases.json and the job's end in events.jsonl)."""
        link = self.link
        assert link is not None and link.role.node != 0, "node 0 runs the phases: use run()"
        try:
            stopped, stops = self._stopper()
            if not link.check_shared(stopped):
                return stopped_outcome(stops[0])
            while True:
                launch = link.next_launch(stopped)
                if launch is None:
                    return stopped_outcome(stops[0])
                if launch.done:
                    result = launch.result or FAILED
                    ended = Termination("node_lost", f"node 0 ended the job: {result}") if result != SUCCEEDED else None
                    return Outcome(result, ended)
                phase = str(launch.phase)
                outcome = self._launch(phase, None, link.rendezvous(phase, str(launch.endpoint)))
                if outcome.result != SUCCEEDED:
                    return outcome
        except KeyboardInterrupt:
            return Outcome(CANCELLED, Termination("user_cancelled", "interrupted"))
        except NodeError as error:
            return Outcome(FAILED, Termination("launch_error", str(error)))

    def _stopper(self) -> tuple[Callable[[], bool], list[Stop]]:
        """A check for a wait between launches (the nodes gathering, a follower waiting for node 0's next
        launch): whether the watcher or the time limit stops the job, and the list it records that Stop in."""
        stops: list[Stop] = []

        def stopped() -> bool:
            stop = self.watcher.tick("") or self._over_time()
            stops.extend([stop] if stop is not None else [])
            return stop is not None

        return stopped, stops

    def _run_phase(self, record: PhaseRecord) -> Outcome:
        skipped = launch.skip_reason(self.run_dir, self.spec, record.name, self.refresh_profile)
        if skipped is not None:
            self._finish_phase(record, SKIPPED, skipped)
            return Outcome(SUCCEEDED)
        record.start()
        self.run_dir.append_event("phase_started", phase=record.name)
        self._publish()
        outcome = self._run_local(record.name) if record.runs == "local" else self._run_process(record.name)
        if outcome.result == SUCCEEDED:
            try:
                launch.complete(self.run_dir, self.spec, record.name)
            except (ProfileError, OSError, ValueError) as error:
                failure = Termination("launch_error", f"{type(error).__name__}: {error}")
                outcome = Outcome(FAILED, failure, phase=record.name)
        self._finish_phase(record, outcome.result, outcome.reason)
        return outcome

    def _run_local(self, phase: str) -> Outcome:
        try:
            launch.run_local(self.run_dir, self.spec, phase, isolate=self.isolate)
        except (SpecError, PlanError, ProfileError, DocumentError, OSError, StepFailed) as error:
            return Outcome(FAILED, Termination("launch_error", f"{phase}: {error}"), phase=phase)
        return Outcome(SUCCEEDED)

    def _run_process(self, phase: str) -> Outcome:
        """Run the phase's processes; a distill phase that stopped to re-plan is launched again (replan.py), one
        that stopped to take a larger gang ends `grown` (grow.py)."""
        try:
            monitor = (
                DistillMonitor(self.run_dir, self.spec, self.store_calibration, self.free_nodes, self.isolate)
                if phase == DISTILL
                else None
            )
        except DocumentError as error:  # the profile of a run directory from an earlier PipeBD
            return Outcome(FAILED, Termination("launch_error", f"{phase}: {error}"), phase=phase)
        while True:
            clear_stop(self.run_dir)
            outcome = self._launch(phase, monitor)
            growing = monitor.growing if monitor is not None else None
            if growing is not None and outcome.result == SUCCEEDED and stopped_early(self.run_dir):
                return Outcome(CANCELLED, Termination(GROWN, growing.reason), 0, phase, grow_to=growing.nodes)
            replanning = monitor is not None and monitor.pending is not None
            if not replanning or outcome.result != SUCCEEDED or not stopped_early(self.run_dir):
                return outcome
            assert monitor is not None
            self.watcher.replanned(monitor.replan())

    def _launch(self, phase: str, monitor: DistillMonitor | None, rendezvous: Rendezvous | None = None) -> Outcome:
        if rendezvous is None and self.link is not None and launch.PHASE_KINDS[phase].runs == "torchrun":
            rendezvous = self.link.publish(phase)  # node 0 opens the launch the other nodes join
        outcome = self._launch_here(phase, monitor, rendezvous)
        if self.link is None:
            return outcome
        self.link.ended(outcome.result, outcome.reason, (outcome.error or "")[:ERROR_IN_EVENT_CHARS])
        if outcome.result == FAILED and outcome.termination is not None and not outcome.termination.infrastructure:
            cause = self.link.infrastructure_cause(outcome.error or "")  # a peer that failed first
            if cause is not None:
                return replace(outcome, termination=Termination("node_lost", cause))
        return outcome

    def _launch_here(self, phase: str, monitor: DistillMonitor | None, rendezvous: Rendezvous | None) -> Outcome:
        process = launch.start_phase(self.run_dir, self.spec, phase, self.extra_env, self.profile_trials, rendezvous)
        self.watcher.process_changed(phase, process)
        if monitor is not None:
            monitor.launched()
        try:
            stop = self._follow(phase, process, monitor)
        finally:
            if process.poll() is None:  # a stop, or an exception escaping (Ctrl-C): never leave it behind
                stop_process_tree(process, self.kill_grace_s)
            self.watcher.drain(phase)
            self.watcher.process_changed(phase, None)
        code = process.returncode
        if stop is not None and stop.checkpoint and code == 0 and not stopped_early(self.run_dir):
            return Outcome(SUCCEEDED, exit_code=0)  # the ranks ended the phase before they saw the stop
        if stop is not None and (not stop.checkpoint or code == 0):
            return Outcome(stop.result, Termination(stop.reason, stop.message), code, phase)
        if code == 0:
            return Outcome(SUCCEEDED, exit_code=0)
        return Outcome(FAILED, diagnose(self.run_dir, phase, code), code, phase)

    def _follow(self, phase: str, process: PhaseProcess, monitor: DistillMonitor | None) -> Stop | None:
        """Poll until the process exits (None) or a stop is asked for (the Stop). A checkpoint stop of the
        distill phase asks the ranks to stop at a step boundary and waits for them (any other stop still
        ends it at once); its Stop is returned once they have exited."""
        asked: Stop | None = None
        asked_at = 0.0
        while process.poll() is None:
            if monitor is not None:
                monitor.tick()
            stop = self.watcher.tick(phase) or self._over_time() or self._peer_failed()
            if asked is not None and asked.grace_s is not None and time.monotonic() - asked_at > asked.grace_s:
                return self._past_grace(asked)
            if stop is not None and stop.checkpoint and phase == DISTILL:
                if asked is None:
                    request_stop(self.run_dir, PAUSE)
                    asked, asked_at = stop, time.monotonic()
            elif stop is not None:
                return replace(stop, checkpoint=False)  # stopped at once: nothing waits for a checkpoint
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(self.poll_s)  # back as soon as it exits: the next phase starts at once
        if monitor is not None:
            monitor.tick(exited=True)  # what the ranks wrote after the last poll
        return asked

    def _past_grace(self, asked: Stop) -> Stop:
        """A checkpoint stop whose ranks did not reach a step boundary within its grace: stopped at once (the
        blocks resume from their last periodic checkpoints)."""
        message = f"{asked.message or asked.reason}; no step boundary within the grace of {asked.grace_s:g} s"
        self.run_dir.append_event("stop_past_grace", reason=asked.reason, grace_s=asked.grace_s)
        return replace(asked, message=message, checkpoint=False)

    def _peer_failed(self) -> Stop | None:
        """Another node's part of this launch failed: stop this node's ranks at once."""
        failure = self.link.peer_failure() if self.link is not None else None
        return Stop(FAILED, "node_lost", failure) if failure is not None else None

    def _over_time(self) -> Stop | None:
        limit = self.time_limit_s
        if limit is not None and time.monotonic() - self.started > limit:
            return Stop(FAILED, "timeout", f"the job ran longer than {limit:g} s")
        return None

    def _finish_phase(self, record: PhaseRecord, result: PhaseOutcome, reason: str | None) -> None:
        record.end(result, reason)
        self._write_tensorboard(record.name)
        duration = record.duration_s or 0.0
        self.run_dir.append_event(
            "phase_finished", phase=record.name, outcome=result, duration_s=duration, reason=reason
        )
        self._publish()

    def _write_tensorboard(self, phase: str) -> None:
        """A training phase's TensorBoard event files, from what its ranks wrote (pipebd_core/tracking/); one
        that cannot be written is an event (tensorboard_failed), never the job's failure."""
        if phase not in TRAINING_PHASES or not self.run_dir.metrics(0, phase).parent.exists():
            return
        try:
            tensorboard.write_phase(self.run_dir, phase)
        except (OSError, ValueError) as error:  # DocumentError included: a plan an earlier PipeBD wrote
            self.run_dir.append_event("tensorboard_failed", phase=phase, error=f"{type(error).__name__}: {error}")

    def _publish(self) -> None:
        self.run_dir.save_phases(self.records)
        self.watcher.phases_changed(self.records)

    def _end(self, outcome: Outcome) -> Outcome:
        """Record how the job ended in events.jsonl (unless its run directory is gone: a deleted job)."""
        if not self.run_dir.root.exists():
            return outcome
        if self.link is not None:
            self.link.done(outcome.result)
        if outcome.result == SUCCEEDED:
            self.run_dir.append_event("finished")
        elif outcome.result == CANCELLED:
            self.run_dir.append_event("cancelled", reason=outcome.reason, phase=outcome.phase)
        else:
            error = (outcome.error or "")[:ERROR_IN_EVENT_CHARS]
            self.run_dir.append_event("failed", reason=outcome.reason, phase=outcome.phase, error=error)
        return outcome
