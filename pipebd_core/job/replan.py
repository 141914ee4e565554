"""Watching a distill phase as it runs: calibration from its telemetry, and re-planning mid-run.

The supervisor gives the distill phase's process a `DistillMonitor` and ticks it on every poll. Once
every rank has a steady window of steps (planning/distill_calibration.py), and again at each epoch boundary, the
monitor calibrates: writes calibration.json and puts the calibration into the cached profile, so the
next job of this workload plans on what training measured (unless the supervisor was told not to:
a benchmark's arms leave the cache alone, so no arm plans from another's calibration); event `calibrated`.

With `schedule.replan` (the default for `auto`), each calibration also decides (`decide`) whether to
re-plan: when the measured step is more than THRESHOLD away from the plan's prediction, the best plan
under the calibrated costs is faster than the running one by more than MARGIN, the job has
re-planned fewer than `schedule.max_replans` times, and what the new plan would save over the
remaining steps outweighs a relaunch (as long as this launch took to reach its first step). Then it
asks the ranks to stop at the next step boundary (control.py: every block checkpointed at one
common step), event `replan_requested`; once they have, `replan` writes the new plan.json, whose
`replans` history records each re-plan (at which step, from which stages to which, predicted and
measured step before and after), event `replanned`; the supervisor launches the phase again and
every block resumes from its checkpoint. The math does not change: each block trains the same
steps, on the same batches, with the same learning rates, whichever ranks run it.

On several nodes the same holds with the same gang: the costs are those of the machines the job runs on
(`planned_machines`: the profile's link between nodes, or the nodes an elastic job has now), node 0's
supervisor opens the next launch of the phase and every node's supervisor starts its part of it
(nodes.py), so the re-planned ranks run on the hosts that ran the others. No gang is asked for again.

An elastic job below its `max_nodes` is also offered free hosts at each calibration (grow.py): when the
planner predicts the larger gang saves more than a relaunch (the same rule, relaunch.py), the monitor asks the
ranks to stop (event `grow_requested`) and the supervisor ends the phase `grown` for the caller to requeue.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from pipebd_core.distill.control import request_stop, stop_step
from pipebd_core.documents.distill_plan import PlanDocument, Replan
from pipebd_core.documents.profile import Profile
from pipebd_core.job import grow, isolated
from pipebd_core.job.relaunch import relaunch_declined
from pipebd_core.planning import profiles
from pipebd_core.planning.distill_calibration import Window, calibrate, group_sizes, measured_step_s, steps_covered
from pipebd_core.planning.distill_costmodel import CostModel
from pipebd_core.planning.distill_search import best_plan
from pipebd_core.planning.topology import planned_machines
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec

RELAUNCH_ENV = "PIPEBD_RELAUNCH_S"  # seconds a relaunch costs, instead of this launch's measured start-up
THRESHOLD = 0.2  # measured step this far from the prediction (relative): look for a better plan
MARGIN = 0.1  # another plan must be predicted this much faster (relative) under the calibrated costs

Triples = list[tuple[int, int, int]]


@dataclass(frozen=True)
class Decision:
    """Whether to re-plan, why, and the numbers it rests on."""

    replan: bool
    reason: str
    measured_step_s: float
    predicted_step_s: float  # the running plan, as planned
    current_step_s: float  # the running plan, under the calibrated costs
    best_step_s: float  # the best plan, under the calibrated costs
    stages: Triples  # the best plan's stages

    def to_json(self) -> dict[str, Any]:
        return {
            "replan": self.replan,
            "reason": self.reason,
            "measured_step_s": self.measured_step_s,
            "predicted_step_s": self.predicted_step_s,
            "calibrated_current_step_s": self.current_step_s,
            "calibrated_best_step_s": self.best_step_s,
            "stages": self.stages,
        }


def decide(
    predicted: float,
    current_stages: Triples,
    model: CostModel,
    measured_s: float,
    remaining_steps: int,
    relaunch_s: float,
    replans_done: int,
    max_replans: int,
) -> Decision:
    """Whether the running plan (its stages, predicted to take `predicted` seconds a step) should give way
    to the best plan under `model` (the calibrated costs), given its measured step time."""
    current = model.pipeline_step(current_stages)
    best = best_plan(model)
    numbers = (measured_s, predicted, current, best.step_s, best.triples())
    off = abs(measured_s - predicted) / predicted if predicted > 0 else float("inf")
    if off <= THRESHOLD:
        reason = f"the prediction held: measured {measured_s * 1e3:.1f} ms a step, predicted {predicted * 1e3:.1f} ms"
    elif best.triples() == current_stages or best.step_s > current * (1 - MARGIN):
        reason = (
            f"measured {measured_s * 1e3:.1f} ms a step against {predicted * 1e3:.1f} ms predicted, but under the"
            f" measured costs no plan is {MARGIN:.0%} faster than this one ({current * 1e3:.1f} ms)"
        )
    elif replans_done >= max_replans:
        reason = f"a faster plan exists, but the job has re-planned {replans_done} times (schedule.max_replans)"
    elif (declined := relaunch_declined(remaining_steps, current, best.step_s, relaunch_s)) is not None:
        reason = declined
    else:
        gain = 1 - best.step_s / current
        return Decision(True, f"measured {off:.0%} off the prediction; a plan {gain:.0%} faster", *numbers)
    return Decision(False, reason, *numbers)


class DistillMonitor:
    """Follows one job's distill phase across its launches (see the module's docstring)."""

    def __init__(
        self,
        run_dir: RunDir,
        spec: Spec,
        store_calibration: bool = True,
        free_nodes: grow.FreeNodes | None = None,
        isolate: bool = False,
    ) -> None:
        self.run_dir, self.spec = run_dir, spec
        self.isolate = isolate  # the re-plan, which builds the workload, in a child process (job/isolated.py)
        self.free_nodes = free_nodes if grow.room(spec) else None  # who offers an elastic job more nodes (grow.py)
        self.growing: grow.Growth | None = None  # a larger gang taken: the ranks stop at the next step boundary
        self.store_calibration = store_calibration  # put each calibration into the cached profile too
        self.profile: Profile | None = run_dir.load_profile() if run_dir.profile.exists() else None
        self.window: Window | None = None
        self.launched_at = 0.0
        self.next_check_step = 0
        self.pending: Decision | None = None
        self.at_step = 0

    @property
    def active(self) -> bool:
        return self.profile is not None and self.run_dir.plan.exists()

    def launched(self) -> None:
        """The phase's ranks were (re)started: measure from now on."""
        self.pending, self.growing = None, None
        if self.active:
            self.window = Window.opened(self.run_dir, self.plan.nproc)
            self.launched_at = time.time()
            self.next_check_step = -1

    @property
    def plan(self) -> PlanDocument:
        return self.run_dir.load_plan()

    def tick(self, exited: bool = False) -> None:
        """Read what the ranks wrote; calibrate when a window is ready (and at each epoch boundary).
        `exited`: the ranks have ended, so what they wrote last is read once more (a short run can end
        between two polls) and no re-plan is considered: nothing is left to run."""
        if self.window is None or self.pending is not None or self.growing is not None:
            return
        self.window.read()
        latest = self.window.latest_step()
        if latest < self.next_check_step or not self.window.ready():
            return
        plan = self.plan
        assert plan.steps is not None, "the plan the ranks follow has its step counts"
        per_epoch = plan.steps.steps_per_epoch
        self.next_check_step = (latest // per_epoch + 1) * per_epoch  # then at the next epoch boundary
        self._calibrate(plan, latest, consider_replan=not exited)

    def _calibrate(self, plan: PlanDocument, latest: int, consider_replan: bool) -> None:
        assert self.window is not None and self.profile is not None
        steady = self.window.steady()
        stages = [stage.to_json() for stage in plan.stages]
        source = {"run": self.run_dir.root.name, "steps": steps_covered(steady), "stages": stages}
        calibration = calibrate(self.profile, steady, group_sizes(plan), source)
        calibrated = self.profile.calibrated(calibration)
        self.run_dir.write_json(self.run_dir.calibration, calibration.to_json())
        if self.store_calibration and self._on_profiled_machines():
            profiles.store(self.spec, calibrated)
        measured = measured_step_s(steady)
        search = plan.steps.search if plan.steps else None
        # the machines the job runs on now: on several nodes the link between them is charged (the profile's), and
        # an elastic job resumed on another gang is planned for the nodes it has (its profile measured on others)
        model = CostModel(calibrated, search.every if search else None, planned_machines(self.spec, calibrated))
        event: dict[str, Any] = {"step": latest, "measured_step_s": measured, "predicted_step_s": None}
        predicted = plan.predictions is not None and bool(plan.stages)
        if predicted:
            event["predicted_step_s"] = plan.details.predicted_step_s
            event["calibrated_step_s"] = model.pipeline_step(plan.stage_triples())
            self._record_after_replan(plan, measured)
        self.run_dir.append_event("calibrated", **event)
        if consider_replan and self.spec.schedule.replans and measured is not None and predicted:
            self._consider(plan, model, measured, latest)
        if consider_replan and self.pending is None and self.free_nodes is not None:
            self._consider_growth(plan, calibrated, latest)

    def _on_profiled_machines(self) -> bool:
        """Whether the job runs on the machines its profile was measured on. An elastic job resumed on another gang
        keeps its calibration in the run directory: the cache entry of its spec's nodes is for a profile measured
        on them."""
        assert self.profile is not None
        schedule = self.spec.schedule
        return (self.profile.nodes, self.profile.nproc) == (schedule.nodes, schedule.world_size)

    def _relaunch_s(self) -> float:
        """What a relaunch costs: as long as this launch took to reach its first step, or PIPEBD_RELAUNCH_S."""
        assert self.window is not None
        if os.environ.get(RELAUNCH_ENV):
            return float(os.environ[RELAUNCH_ENV])
        first_lines = [lines[0].time for lines in self.window.lines.values() if lines]
        return max(first_lines, default=self.launched_at) - self.launched_at

    def _consider_growth(self, plan: PlanDocument, calibrated: Profile, latest: int) -> None:
        """Take a larger gang when hosts are free and the planner predicts it pays (grow.py)."""
        assert self.free_nodes is not None
        free = self.free_nodes()
        remaining = plan.total_steps - latest - 1
        growth = grow.consider(self.spec, calibrated, plan, free, remaining, self._relaunch_s())
        if growth is None:
            return
        if growth.grow:
            self.growing = growth
            request_stop(self.run_dir, grow.GROWN)
        self.run_dir.append_event("grow_requested" if growth.grow else "grow_declined", step=latest, **growth.event())

    def _consider(self, plan: PlanDocument, model: CostModel, measured: float, latest: int) -> None:
        assert self.window is not None
        relaunch_s = self._relaunch_s()
        done = len(plan.details.replans)
        remaining = plan.total_steps - latest - 1
        assert plan.predictions is not None, "only a plan with predictions is re-planned"
        predicted, stages = plan.predictions.predicted_step_s, plan.stage_triples()
        bound = self.spec.schedule.max_replans
        decision = decide(predicted, stages, model, measured, remaining, relaunch_s, done, bound)
        if decision.replan:
            self.pending, self.at_step = decision, latest  # the ranks stop a step or two later
            request_stop(self.run_dir, "replan")
            self.run_dir.append_event("replan_requested", step=latest, **decision.to_json())
        elif abs(measured - decision.predicted_step_s) > THRESHOLD * decision.predicted_step_s:
            self.run_dir.append_event("replan_declined", step=latest, **decision.to_json())

    def _record_after_replan(self, plan: PlanDocument, measured: float | None) -> None:
        """The first measurement under a plan that came from a re-plan completes its history entry."""
        history = plan.details.replans
        if history and history[-1].measured_after_s is None and measured is not None:
            history[-1].measured_after_s = measured
            self.run_dir.write_json(self.run_dir.plan, plan.to_json())

    def replan(self) -> Replan:
        """After the ranks stopped on a re-plan request: write the new plan (with its history); returns
        the history entry."""
        decision, previous = self.pending, self.plan
        assert decision is not None and self.profile is not None
        replanned = isolated.run_step("replan", self.spec, self.run_dir, self.isolate)
        assert replanned is not None, "the replan step gives back the plan document"
        document = PlanDocument.from_json(replanned)
        entry = Replan(
            at=time.time(),
            decided_at_step=self.at_step,
            resumed_at_step=stop_step(self.run_dir),
            from_=previous.stages,
            to=document.stages,
            measured_before_s=decision.measured_step_s,
            predicted_before_s=decision.predicted_step_s,
            predicted_after_s=document.details.predicted_step_s,
            measured_after_s=None,
            reason=decision.reason,
        )
        document.details.replans = [*previous.details.replans, entry]
        self.run_dir.write_json(self.run_dir.plan, document.to_json())
        self.run_dir.append_event("replanned", **entry.to_json())
        self.pending = None
        return entry
