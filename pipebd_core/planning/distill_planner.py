"""Resolve a spec into the plan the ranks follow, from measured costs when a profile is at hand.

`resolve_plan` is the job's `plan` phase (and, without a profile, the preflight of every launch):
the data set's step counts and streams, the workload's block shapes and FLOP estimates, and the
schedule.

With a profile: `auto` runs the best plan of the exact search, `tr`/`tr_dpu` without stages the best
unreplicated plan, `ls` bin-packs measured task costs; plan.json then also records the ranked
alternatives, every mode's predicted step time, the ideal bound, simulated timelines and how far the
profile can be trusted (trust.py). Without a
profile (schedule.profile: false) stages are balanced on FLOP estimates.
"""

from __future__ import annotations

import math

from pipebd_core.data.batches import split_streams, steps_per_epoch, total_steps
from pipebd_core.data.datasets import build_dataset, check_dataset
from pipebd_core.data.streams import SearchSchedule, StepPlan, shard_rows
from pipebd_core.distill.plan import Plan, build_stages
from pipebd_core.documents.distill_plan import Estimates, PlanDetails, Predictions, Timeline
from pipebd_core.documents.errors import PlanError
from pipebd_core.documents.profile import Profile
from pipebd_core.planning.balance import balanced_partition, longest_first_assignment
from pipebd_core.planning.distill_costmodel import CostModel
from pipebd_core.planning.distill_search import best_plan, search
from pipebd_core.planning.distill_simulate import simulate
from pipebd_core.planning.topology import Topology, planned_machines
from pipebd_core.planning.trust import assess
from pipebd_core.spec import ScheduleSpec, Spec, StageSpec
from pipebd_core.workloads.probe import BlockProbe, probe_workload
from pipebd_core.workloads.workload import build_workload, search_settings

PREDICTED_MODES = ("dp", "ls", "ir", "tr", "tr_dpu", "hybrid")
SIMULATED_STEPS = 4


def _specs(triples: list[tuple[int, int, int]]) -> list[StageSpec]:
    return [StageSpec(start=start, stop=stop, replicas=k) for start, stop, k in triples]


def default_stages(
    schedule: ScheduleSpec, num_blocks: int, estimates: BlockProbe, model: CostModel | None
) -> list[StageSpec]:
    """One stage per rank: the best unreplicated plan when measured, else FLOP-balanced."""
    mode, nproc = schedule.mode, schedule.world_size  # every rank of every node
    if nproc > num_blocks:
        fewer = f"--nproc {num_blocks}" if schedule.nodes == 1 else f"{num_blocks} ranks in all (nodes x nproc)"
        raise PlanError(
            f"mode {mode!r} gives each of {nproc} ranks its own stage but the workload has {num_blocks}"
            f" blocks; use {fewer} or fewer, or mode 'hybrid', 'ir' or 'auto' to replicate stages"
        )
    if model is not None:
        return _specs(best_plan(model, unreplicated=True).triples())
    ranges = balanced_partition(estimates.stage_costs(), nproc)
    return [StageSpec(start=start, stop=stop, replicas=1) for start, stop in ranges]


def make_plan(
    schedule: ScheduleSpec, num_blocks: int, batch_size: int, estimates: BlockProbe, model: CostModel | None
) -> Plan:
    """The plan the runtime follows; PlanError says what would work instead."""
    mode, nproc = schedule.mode, schedule.world_size  # every rank of every node
    plan = Plan(mode, nproc, num_blocks, batch_size, nodes=schedule.nodes)
    if mode == "dp":
        shard_rows(batch_size, nproc)
    elif mode == "ls":
        costs = model.ls_costs() if model else estimates.prefix_costs()
        plan.assignment = longest_first_assignment(costs, nproc)
    elif mode == "ir":
        plan.stages = build_stages(_specs([(0, num_blocks, nproc)]), nproc, num_blocks, batch_size)
    elif mode == "auto":
        assert model is not None, "the spec refuses auto without a profile"
        plan.stages = build_stages(_specs(best_plan(model).triples()), nproc, num_blocks, batch_size)
    elif schedule.stages:
        if mode != "hybrid" and any(stage.replicas > 1 for stage in schedule.stages):
            raise PlanError(f"mode {mode!r} runs one rank per stage; use mode 'hybrid' for replicated stages")
        plan.stages = build_stages(schedule.stages, nproc, num_blocks, batch_size)
    else:
        plan.stages = build_stages(
            default_stages(schedule, num_blocks, estimates, model), nproc, num_blocks, batch_size
        )
    return plan


def mode_plans(model: CostModel) -> dict[str, Plan]:
    """The plan each mode would run on this profile (tr needs at least as many blocks as ranks)."""
    blocks, nproc, batch, nodes = model.num_blocks, model.nproc, model.batch_size, model.topology.nodes

    def plan(mode: str, stages: list[tuple[int, int, int]] | None = None) -> Plan:
        built = build_stages(_specs(stages), nproc, blocks, batch) if stages else []
        return Plan(mode, nproc, blocks, batch, built, nodes=nodes)

    plans = {"dp": plan("dp"), "ls": plan("ls"), "ir": plan("ir", [(0, blocks, nproc)])}
    plans["ls"].assignment = model.ls_assignment()
    if nproc <= blocks:
        unreplicated = best_plan(model, unreplicated=True).triples()
        plans["tr"], plans["tr_dpu"] = plan("tr", unreplicated), plan("tr_dpu", unreplicated)
    plans["hybrid"] = plan("hybrid", best_plan(model).triples())
    return plans


def timeline(plan: Plan, model: CostModel) -> Timeline:
    """`plan` simulated for SIMULATED_STEPS steps on `model`'s costs."""
    step_s, segments = simulate(plan, model, SIMULATED_STEPS)
    return Timeline.model_validate({"step_s": step_s, "segments": [s.to_json() for s in segments]})


def predictions(plan: Plan, model: CostModel) -> Predictions:
    """Ranked alternatives, every mode's predicted step time, the profile's even split of the work (a prediction,
    not a bound: `pipebd bench` measures one), simulated timelines."""
    result = search(model)
    simulations = {mode: timeline(mode_plan, model) for mode, mode_plan in mode_plans(model).items()}
    simulations["chosen"] = timeline(plan, model)
    return Predictions(
        predicted_step_s=simulations["chosen"].step_s,
        ideal_step_s=model.ideal_step(),
        mode_step_s={mode: simulations[mode].step_s for mode in PREDICTED_MODES if mode in simulations},
        alternatives=[ranked.entry() for ranked in result.plans],
        plans_considered=result.considered,
        stages_rejected_for_memory=result.rejected_for_memory,
        simulation=simulations,
    )


def step_plan(spec: Spec) -> StepPlan:
    """How the spec's data turns into optimiser steps: streams, counts, when architecture updates happen."""
    settings = search_settings(spec)
    train, arch = split_streams(spec, check_dataset(spec), settings.holdout if settings else None)
    total = total_steps(spec, train.count)
    search = None
    if settings is not None:
        search = SearchSchedule(math.ceil(settings.warmup * total), settings.update_every)
    return StepPlan(total, steps_per_epoch(spec, train.count), train, arch, search)


def cost_model(spec: Spec, profile: Profile, topology: Topology | None = None) -> CostModel:
    """The cost model of `profile`, with the spec's architecture-update rate (nas), for the machines it was
    measured on or for `topology` (a what-if: `pipebd plan --nodes --link-gbps`)."""
    search = step_plan(spec).search
    return CostModel(profile, search.every if search else None, topology, spec.schedule.threads_per_rank)


def resolve_plan(spec: Spec, profile: Profile | None) -> Plan:
    """Check the data, build and probe the workload once (on CPU) and resolve the plan: from `profile`
    when given (with the ranked alternatives and every mode's prediction), else from FLOP estimates."""
    steps = step_plan(spec)
    workload = build_workload(spec)
    sample = build_dataset(spec)[0][0]
    probe = probe_workload(workload, sample)
    model = None
    if profile is not None:
        every = steps.search.every if steps.search else None
        model = CostModel(profile, every, planned_machines(spec, profile), spec.schedule.threads_per_rank)
    plan = make_plan(spec.schedule, workload.num_blocks, spec.data.batch_size, probe, model)
    plan.steps, plan.shapes, plan.block_names = steps, probe.shapes, workload.block_names
    plan.details = PlanDetails(estimates=Estimates(**probe.to_json()), warnings=workload.warnings)
    if profile is not None and model is not None:
        plan.details.predictions = predictions(plan, model)
        plan.details.profile_trust = assess(profile)
    return plan
