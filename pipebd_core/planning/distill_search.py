"""The planner: every plan (contiguous stages, replica counts summing to N), ranked exactly.

An exact dynamic programme over (blocks covered, ranks used) keeps the K best partial plans of each
state. A plan's step time is its slowest stage (a max), which is monotone, so the K best full plans
are always built from K-best partial plans: the ranking equals exhaustive enumeration, and 20 blocks
on 8 devices plan in milliseconds. Plans with a stage that exceeds device memory are rejected.
"""

from __future__ import annotations

import functools
import heapq
from dataclasses import dataclass

from pipebd_core.documents.distill_plan import RankedEntry, StageParts, StageSpan
from pipebd_core.documents.errors import PlanError
from pipebd_core.planning.distill_costmodel import CostModel, StageCost

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
    """The `top_k` best plans on `model.nproc` ranks; `max_replicas=1` gives unreplicated (tr) plans.

    Stages take ranks in order. On one node a stage costs the same wherever it lies; on several (its receive
    and all-reduce charged by the links they cross: CostModel.placed) the state also keeps the last stage's
    replica count, which with the ranks used so far says where the next stage's producers are."""
    blocks, nproc = model.num_blocks, model.nproc
    limit = min(max_replicas or nproc, model.batch_size)
    placed = model.topology.nodes > 1
    costs = {
        (start, end, k): model.stage(start, end, k)
        for end in range(1, blocks + 1)
        for start in range(end)
        for k in range(1, limit + 1)
    }
    fitting = {key for key, cost in costs.items() if model.fits(cost)}

    @functools.cache
    def stage_s(start: int, end: int, k: int, first: int, previous: int) -> float:
        return model.placed(costs[(start, end, k)], first, range(first - previous, first)).total_s

    # (blocks covered, ranks used) -> last stage's replicas (0: not tracked, one node) -> K best partial plans
    best: dict[tuple[int, int], dict[int, list[Partial]]] = {(0, 0): {0: [(0.0, 0.0, ())]}}
    count: dict[tuple[int, int], int] = {(0, 0): 1}
    for end in range(1, blocks + 1):
        for ranks in range(1, nproc + 1):
            buckets: dict[int, list[Partial]] = {}
            total = 0
            for start in range(end):
                for k in range(1, min(limit, ranks) + 1):
                    earlier = best.get((start, ranks - k))
                    if not earlier or (start, end, k) not in fitting:
                        continue
                    total += count[(start, ranks - k)]
                    triple = ((start, end, k),)
                    bucket = buckets.setdefault(k if placed else 0, [])
                    for previous, partials in earlier.items():
                        cost = stage_s(start, end, k, ranks - k, previous) if placed else costs[(start, end, k)].total_s
                        bucket.extend(
                            (max(step, cost), work + cost * k, stages + triple) for step, work, stages in partials
                        )
            if buckets:
                best[(end, ranks)] = {last: heapq.nsmallest(top_k, bucket) for last, bucket in buckets.items()}
                count[(end, ranks)] = total
    finished = [partial for partials in best.get((blocks, nproc), {}).values() for partial in partials]
    plans = [
        RankedPlan(step, work, tuple(model.placed_stages(stages)))
        for step, work, stages in heapq.nsmallest(top_k, finished)
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
