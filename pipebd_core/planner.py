"""The planner: every plan (contiguous stages, replica counts summing to N), ranked exactly.

An exact dynamic programme over (blocks covered, ranks used) keeps the K best partial plans of each
state. A plan's step time is its slowest stage (a max), which is monotone, so the K best full plans
are always built from K-best partial plans: the ranking equals exhaustive enumeration, and 20 blocks
on 8 devices plan in milliseconds. Plans with a stage that exceeds device memory are rejected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipebd_core.costmodel import CostModel, StageCost
from pipebd_core.plan import PlanError

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

    def to_json(self) -> dict[str, Any]:
        return {
            "stages": [{"start": s.start, "stop": s.stop, "replicas": s.replicas} for s in self.stages],
            "step_s": self.step_s,
            "bottleneck_stage": self.bottleneck,
            "stage_s": [s.total_s for s in self.stages],
            "stage_parts": [
                {"input_s": s.input_s, "compute_s": s.compute_s, "allreduce_s": s.allreduce_s} for s in self.stages
            ],
            "memory_bytes": [s.memory_bytes for s in self.stages],
        }


@dataclass
class Search:
    plans: list[RankedPlan]
    considered: int  # plans that fit in memory
    rejected_for_memory: int  # stage choices refused because they would not fit


def search(model: CostModel, top_k: int = TOP_K, max_replicas: int | None = None) -> Search:
    """The `top_k` best plans on `model.nproc` ranks; `max_replicas=1` gives unreplicated (tr) plans."""
    blocks, nproc = model.num_blocks, model.nproc
    limit = min(max_replicas or nproc, model.batch_size)
    best: dict[tuple[int, int], list[RankedPlan]] = {(0, 0): [RankedPlan(0.0, 0.0, ())]}
    count: dict[tuple[int, int], int] = {(0, 0): 1}
    rejected = 0
    stage_cache: dict[tuple[int, int, int], StageCost | None] = {}
    for end in range(1, blocks + 1):
        for ranks in range(1, nproc + 1):
            candidates: list[RankedPlan] = []
            total = 0
            for start in range(end):
                for replicas in range(1, min(limit, ranks) + 1):
                    previous = best.get((start, ranks - replicas))
                    if not previous:
                        continue
                    key = (start, end, replicas)
                    if key not in stage_cache:
                        cost = model.stage(start, end, replicas)
                        stage_cache[key] = cost if model.fits(cost) else None
                        rejected += stage_cache[key] is None
                    stage = stage_cache[key]
                    if stage is None:
                        continue
                    total += count[(start, ranks - replicas)]
                    for partial in previous:
                        candidates.append(
                            RankedPlan(
                                max(partial.step_s, stage.total_s),
                                partial.total_s + stage.total_s * replicas,
                                (*partial.stages, stage),
                            )
                        )
            candidates.sort(key=lambda plan: (plan.step_s, plan.total_s, plan.triples()))
            if candidates:
                best[(end, ranks)] = candidates[:top_k]
                count[(end, ranks)] = total
    plans = best.get((blocks, nproc), [])
    return Search(plans, count.get((blocks, nproc), 0), rejected)


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
