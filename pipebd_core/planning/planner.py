"""The planner: every plan (contiguous stages, replica counts summing to N), ranked exactly.

An exact dynamic programme over (blocks covered, ranks used) keeps the K best partial plans of each
state. A plan's step time is its slowest stage (a max), which is monotone, so the K best full plans
are always built from K-best partial plans: the ranking equals exhaustive enumeration, and 20 blocks
on 8 devices plan in milliseconds. Plans with a stage that exceeds device memory are rejected.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from pipebd_core.distill.plan import PlanError
from pipebd_core.documents.plan import RankedEntry, StageParts, StageSpan
from pipebd_core.planning.costmodel import CostModel, StageCost

TOP_K = 10


@dataclass(frozen=True)
class RankedPlan:
    step_s: float
    total_s: float  # sum of stage time x replicas: the tie-break (less work wins)
    stages: tuple[StageCost, ...]

    @property
    def bottleneck(self) -> int:
        times = [stage.total_s for stage in self.stages]
        return times.index(max(times))

    def triples(self) -> list[tuple[int, int, int]]:
        return [(s.start, s.stop, s.replicas) for s in self.stages]

    def entry(self) -> RankedEntry:
        """This plan as plan.json's `alternatives` list it."""
        return RankedEntry(
            stages=[StageSpan(start=s.start, stop=s.stop, replicas=s.replicas) for s in self.stages],
            step_s=self.step_s,
            bottleneck_stage=self.bottleneck,
            stage_s=[s.total_s for s in self.stages],
            stage_parts=[
                StageParts(input_s=s.input_s, compute_s=s.compute_s, allreduce_s=s.allreduce_s, overhead_s=s.overhead_s)
                for s in self.stages
            ],
            memory_bytes=[s.memory_bytes for s in self.stages],
        )


@dataclass
class Search:
    plans: list[RankedPlan]
    considered: int  # plans that fit in memory
    rejected_for_memory: int  # stage choices refused because they would not fit


Partial = tuple[float, float, tuple[tuple[int, int, int], ...]]  # (step time, total work, stages)


def search(model: CostModel, top_k: int = TOP_K, max_replicas: int | None = None) -> Search:
    """The `top_k` best plans on `model.nproc` ranks; `max_replicas=1` gives unreplicated (tr) plans."""
    blocks, nproc = model.num_blocks, model.nproc
    limit = min(max_replicas or nproc, model.batch_size)
    costs = {
        (start, end, k): model.stage(start, end, k)
        for end in range(1, blocks + 1)
        for start in range(end)
        for k in range(1, limit + 1)
    }
    fitting = {key: cost.total_s for key, cost in costs.items() if model.fits(cost)}
    best: dict[tuple[int, int], list[Partial]] = {(0, 0): [(0.0, 0.0, ())]}
    count: dict[tuple[int, int], int] = {(0, 0): 1}
    for end in range(1, blocks + 1):
        for ranks in range(1, nproc + 1):
            candidates: list[Partial] = []
            total = 0
            for start in range(end):
                for k in range(1, min(limit, ranks) + 1):
                    previous = best.get((start, ranks - k))
                    stage_s = fitting.get((start, end, k))
                    if not previous or stage_s is None:
                        continue
                    total += count[(start, ranks - k)]
                    triple = ((start, end, k),)
                    candidates.extend(
                        (max(step, stage_s), work + stage_s * k, stages + triple) for step, work, stages in previous
                    )
            if candidates:
                best[(end, ranks)] = heapq.nsmallest(top_k, candidates)
                count[(end, ranks)] = total
    plans = [
        RankedPlan(step, work, tuple(costs[triple] for triple in stages))
        for step, work, stages in best.get((blocks, nproc), [])
    ]
    return Search(plans, count.get((blocks, nproc), 0), len(costs) - len(fitting))


def best_plan(model: CostModel, unreplicated: bool = False) -> RankedPlan:
    result = search(model, top_k=1, max_replicas=1 if unreplicated else None)
    if not result.plans:
        what = " with one rank per stage" if unreplicated else ""
        raise PlanError(
            f"no plan{what} fits in memory: {model.num_blocks} blocks on {model.nproc} ranks"
            f" with {model.memory_limit / 2**30:.1f} GiB per device; use fewer ranks per stage, a smaller batch,"
            " or mode 'hybrid' with explicit stages"
        )
    return result.plans[0]
