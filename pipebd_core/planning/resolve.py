"""Resolve a spec's schedule into a plan, from measured costs when a profile is at hand.

With a profile: `auto` runs the best plan of the exact search, `tr`/`tr_dpu` without stages the best
unreplicated plan, `ls` bin-packs measured task costs; plan.json then also records the ranked
alternatives, every mode's predicted step time, the ideal bound and simulated timelines. Without a
profile (schedule.profile: false) stages are balanced on FLOP estimates.
"""

from __future__ import annotations

from typing import Any

from pipebd_core.plan import Plan, PlanError, balanced_partition, build_stages, longest_first_assignment, shard_rows
from pipebd_core.planning.costmodel import CostModel
from pipebd_core.planning.planner import best_plan, search
from pipebd_core.planning.probe import BlockProbe
from pipebd_core.planning.simulate import simulate
from pipebd_core.spec import ScheduleSpec, StageSpec

PREDICTED_MODES = ("dp", "ls", "ir", "tr", "tr_dpu", "hybrid")
SIMULATED_STEPS = 4


def _specs(triples: list[tuple[int, int, int]]) -> list[StageSpec]:
    return [StageSpec(start=start, stop=stop, replicas=k) for start, stop, k in triples]


def default_stages(
    schedule: ScheduleSpec, num_blocks: int, estimates: BlockProbe, model: CostModel | None
) -> list[StageSpec]:
    """One stage per rank: the best unreplicated plan when measured, else FLOP-balanced."""
    mode, nproc = schedule.mode, schedule.nproc
    if nproc > num_blocks:
        raise PlanError(
            f"mode {mode!r} gives each of {nproc} ranks its own stage but the workload has {num_blocks}"
            f" blocks; use --nproc {num_blocks} or fewer, or mode 'hybrid', 'ir' or 'auto' to replicate stages"
        )
    if model is not None:
        return _specs(best_plan(model, unreplicated=True).triples())
    ranges = balanced_partition(estimates.stage_costs(), nproc)
    return [StageSpec(start=start, stop=stop, replicas=1) for start, stop in ranges]


def make_plan(
    schedule: ScheduleSpec, num_blocks: int, batch_size: int, estimates: BlockProbe, model: CostModel | None
) -> Plan:
    """The plan the runtime follows; PlanError says what would work instead."""
    mode, nproc = schedule.mode, schedule.nproc
    plan = Plan(mode, nproc, num_blocks, batch_size)
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
    blocks, nproc, batch = model.num_blocks, model.nproc, model.batch_size
    plans = {"dp": Plan("dp", nproc, blocks, batch), "ls": Plan("ls", nproc, blocks, batch)}
    plans["ls"].assignment = model.ls_assignment()
    plans["ir"] = Plan("ir", nproc, blocks, batch, build_stages(_specs([(0, blocks, nproc)]), nproc, blocks, batch))
    if nproc <= blocks:
        unreplicated = build_stages(_specs(best_plan(model, unreplicated=True).triples()), nproc, blocks, batch)
        plans["tr"] = Plan("tr", nproc, blocks, batch, unreplicated)
        plans["tr_dpu"] = Plan("tr_dpu", nproc, blocks, batch, unreplicated)
    best = build_stages(_specs(best_plan(model).triples()), nproc, blocks, batch)
    plans["hybrid"] = Plan("hybrid", nproc, blocks, batch, best)
    return plans


def predictions(plan: Plan, model: CostModel) -> dict[str, Any]:
    """Ranked alternatives, every mode's predicted step time, the ideal bound, simulated timelines."""
    result = search(model)
    simulations: dict[str, Any] = {}
    for mode, mode_plan in mode_plans(model).items():
        step_s, segments = simulate(mode_plan, model, SIMULATED_STEPS)
        simulations[mode] = {"step_s": step_s, "segments": [s.to_json() for s in segments]}
    step_s, segments = simulate(plan, model, SIMULATED_STEPS)
    simulations["chosen"] = {"step_s": step_s, "segments": [s.to_json() for s in segments]}
    return {
        "predicted_step_s": step_s,
        "ideal_step_s": model.ideal_step(),
        "mode_step_s": {mode: simulations[mode]["step_s"] for mode in PREDICTED_MODES if mode in simulations},
        "alternatives": [ranked.to_json() for ranked in result.plans],
        "plans_considered": result.considered,
        "stages_rejected_for_memory": result.rejected_for_memory,
        "simulation": simulations,
    }
