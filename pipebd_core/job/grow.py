"""Growing back: an elastic job running on fewer nodes than it may use takes a larger gang when that pays.

A job whose `schedule.elastic.max_nodes` is above the nodes it runs on now is offered more nodes while it
distils: whoever supervises it says how many more hosts are free to join (`FreeNodes`: the service's worker
counts idle workers on other hosts, worker/launcher.py). At each calibration of the distill phase (replan.py:
the first steady window, then every epoch boundary) `consider` plans the job on the larger gang from its
calibrated profile (the blocks' costs are per block; the link between nodes is the profile's:
distill_planner.py `planned_machines`) and takes it by the rule re-planning uses (relaunch.py
`relaunch_declined`): what the remaining steps would save must exceed a measured relaunch. Taking it stops
the ranks at their next step boundary with every block saved; the job's run ends `grown` (not a fault: no
restart used) and goes back to the queue for the larger gang, where it is reshaped and re-planned
(elastic.py) and every block continues from its checkpoint. events.jsonl records `grow_requested` (or
`grow_declined`, with the numbers it rests on).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from pipebd_core.distill.plan import Plan
from pipebd_core.documents.distill_plan import PlanDocument
from pipebd_core.documents.errors import PlanError
from pipebd_core.documents.profile import Profile
from pipebd_core.job.relaunch import relaunch_declined
from pipebd_core.planning.distill_costmodel import CostModel
from pipebd_core.planning.topology import planned_machines
from pipebd_core.spec import Spec

FreeNodes = Callable[[], int]  # how many more hosts could join the job's gang now (0: none)

GROWN = "grown"  # the termination reason of a run stopped to take a larger gang


@dataclass(frozen=True)
class Growth:
    """Whether to take a larger gang, why, and the numbers it rests on."""

    grow: bool
    nodes: int  # the gang it would run on
    reason: str
    running_step_s: float  # the running plan, under the calibrated costs
    grown_step_s: float  # the plan for `nodes`, under the same costs
    remaining_steps: int
    relaunch_s: float

    def event(self) -> dict[str, float | int | str | bool]:
        """The fields of its `grow_requested` or `grow_declined` event."""
        return asdict(self)


def room(spec: Spec) -> int:
    """How many more nodes the job may take (0: not elastic, or at its maximum already)."""
    elastic, nodes = spec.schedule.elastic, spec.schedule.nodes
    if elastic is None or elastic.max_nodes is None:
        return 0
    return max(0, elastic.max_nodes - nodes)


def step_on(spec: Spec, profile: Profile, plan: PlanDocument, nodes: int) -> float:
    """The step time the planner predicts for the job's plan on `nodes` nodes (its mode, or its pinned stages
    refitted), simulated on `profile`'s costs. The planner is imported here, when an elastic job is offered
    hosts: through the workload probe it imports torch, which a worker that supervises jobs otherwise never does
    (job/isolated.py)."""
    from pipebd_core.planning.distill_planner import make_plan, timeline
    from pipebd_core.workloads.probe import BlockProbe

    schedule = spec.schedule.on_nodes(nodes)
    moved = spec.model_copy(update={"schedule": schedule})
    every = plan.steps.search.every if plan.steps and plan.steps.search else None
    model = CostModel(profile, every, planned_machines(moved, profile))
    estimates = plan.details.estimates
    if schedule.nodes == plan.nodes and schedule.world_size == plan.nproc:
        return timeline(Plan.from_document(plan), model).step_s
    assert estimates is not None, "a planned run directory keeps its probe's estimates"
    probe = BlockProbe(**estimates.model_dump())
    return timeline(make_plan(schedule, plan.num_blocks, plan.batch_size, probe, model), model).step_s


def consider(
    spec: Spec, profile: Profile, plan: PlanDocument, free: int, remaining_steps: int, relaunch_s: float
) -> Growth | None:
    """Whether to stop now and take `free` more hosts (up to `elastic.max_nodes`); None when none can join."""
    more = min(free, room(spec))
    if more <= 0:
        return None
    nodes = spec.schedule.nodes + more
    running = step_on(spec, profile, plan, spec.schedule.nodes)
    try:
        grown = step_on(spec, profile, plan, nodes)
    except PlanError as error:  # e.g. more ranks than blocks for one stage each, or a batch it cannot split
        return Growth(False, nodes, f"no plan on {nodes} nodes: {error}", running, running, remaining_steps, relaunch_s)
    numbers = (running, grown, remaining_steps, relaunch_s)
    if grown >= running:
        reason = f"on {nodes} nodes the plan is predicted no faster ({grown * 1e3:.1f} ms a step, now"
        reason += f" {running * 1e3:.1f} ms)"
        return Growth(False, nodes, reason, *numbers)
    declined = relaunch_declined(remaining_steps, running, grown, relaunch_s)
    if declined is not None:
        return Growth(False, nodes, declined, *numbers)
    gain = 1 - grown / running
    reason = f"{more} more host(s) free: on {nodes} nodes the plan is predicted {gain:.0%} faster"
    return Growth(True, nodes, reason, *numbers)
