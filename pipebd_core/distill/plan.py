"""Plans: which rank runs which blocks on which rows of the batch, and the routes between them.

A pipeline plan is a list of contiguous stages; stage s owns blocks [start, stop) and is replicated on
`replicas` consecutive ranks that split the global batch into shards differing by at most one row.
Activations at a stage boundary travel from each producer replica to each consumer replica whose
row range overlaps its own: routing is derived from the plan, never written by hand.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pipebd_core.data.streams import StepPlan, shard_rows
from pipebd_core.documents.distill_plan import PlanDetails, PlanDocument, RankEntry, RouteEntry, StageEntry
from pipebd_core.documents.errors import PlanError
from pipebd_core.spec import StageSpec

PIPELINE_MODES = ("ir", "tr", "tr_dpu", "hybrid", "auto")


@dataclass(frozen=True)
class Route:
    """Rows [start, stop) of the global batch, sent from `src` to `dst` at block boundary `boundary`."""

    src: int
    dst: int
    boundary: int
    start: int
    stop: int


@dataclass(frozen=True)
class Stage:
    start: int
    stop: int
    ranks: tuple[int, ...]
    rows: tuple[tuple[int, int], ...]  # one row range of the global batch per replica

    @property
    def replicas(self) -> int:
        return len(self.ranks)

    @property
    def blocks(self) -> range:
        return range(self.start, self.stop)

    def rows_of(self, rank: int) -> tuple[int, int]:
        return self.rows[self.ranks.index(rank)]


@dataclass
class Plan:
    """The resolved schedule of one job, written to plan.json."""

    mode: str
    nproc: int
    num_blocks: int
    batch_size: int
    stages: list[Stage] = field(default_factory=list)  # pipeline modes
    assignment: list[list[int]] = field(default_factory=list)  # ls: blocks per rank
    steps: StepPlan | None = None  # None only in plans built for the planner's own comparisons
    shapes: list[list[int]] = field(default_factory=list)  # per-sample shape of x_0 .. x_B
    block_names: list[str] = field(default_factory=list)
    details: PlanDetails = field(default_factory=PlanDetails)  # informational: estimates, predictions, warnings
    nodes: int = 1  # nproc / nodes consecutive ranks on each node

    def crosses_nodes(self, route: Route) -> bool:
        """Whether `route` leaves its node (ranks are numbered node by node)."""
        per_node = self.nproc // self.nodes
        return route.src // per_node != route.dst // per_node

    @property
    def step_plan(self) -> StepPlan:
        """The step counts and streams; a plan the runtime follows always has them."""
        if self.steps is None:
            raise PlanError("this plan has no step counts: it was built to compare plans, not to run")
        return self.steps

    @property
    def is_pipeline(self) -> bool:
        return self.mode in PIPELINE_MODES

    def stage_of(self, rank: int) -> Stage:
        for stage in self.stages:
            if rank in stage.ranks:
                return stage
        raise KeyError(f"rank {rank} is in no stage of this plan")

    def routes_into(self, rank: int) -> list[Route]:
        stage = self.stage_of(rank)
        index = self.stages.index(stage)
        return [] if index == 0 else routes_between(self.stages[index - 1], stage, only_dst=rank)

    def routes_out_of(self, rank: int) -> list[Route]:
        stage = self.stage_of(rank)
        index = self.stages.index(stage)
        last = index == len(self.stages) - 1
        return [] if last else routes_between(stage, self.stages[index + 1], only_src=rank)

    def document(self) -> PlanDocument:
        """plan.json: this plan with its routes, each rank's part and its details."""
        stages = [
            StageEntry(start=s.start, stop=s.stop, replicas=s.replicas, ranks=list(s.ranks), rows=list(s.rows))
            for s in self.stages
        ]
        pairs = zip(self.stages, self.stages[1:], strict=False)
        routes = [r for a, b in pairs for r in routes_between(a, b)]
        return PlanDocument(
            mode=self.mode,
            nproc=self.nproc,
            nodes=self.nodes,
            num_blocks=self.num_blocks,
            batch_size=self.batch_size,
            stages=stages,
            routes=[RouteEntry(**asdict(r), crosses_nodes=self.crosses_nodes(r)) for r in routes],
            assignment=self.assignment,
            ranks=[RankEntry.model_validate(describe_rank(self, rank)) for rank in range(self.nproc)],
            steps=self.steps.counts() if self.steps else None,
            shapes=self.shapes,
            block_names=self.block_names,
            details=self.details,
        )

    def to_json(self) -> dict[str, Any]:
        return self.document().to_json()

    @classmethod
    def from_document(cls, document: PlanDocument) -> Plan:
        stages = [Stage(s.start, s.stop, tuple(s.ranks), tuple(s.rows)) for s in document.stages]
        return cls(
            mode=document.mode,
            nproc=document.nproc,
            num_blocks=document.num_blocks,
            batch_size=document.batch_size,
            stages=stages,
            assignment=document.assignment,
            steps=StepPlan.from_counts(document.steps) if document.steps else None,
            shapes=document.shapes,
            block_names=document.block_names,
            details=document.details,
            nodes=document.nodes,
        )

    @classmethod
    def from_json(cls, data: Any) -> Plan:
        """A plan from plan.json; DocumentError when it was written by another version."""
        return cls.from_document(PlanDocument.from_json(data))


def routes_between(
    producer: Stage, consumer: Stage, only_src: int | None = None, only_dst: int | None = None
) -> list[Route]:
    """Every (producer replica, consumer replica) pair whose row ranges overlap, with the overlap."""
    routes = []
    for src, (src_start, src_stop) in zip(producer.ranks, producer.rows, strict=True):
        for dst, (dst_start, dst_stop) in zip(consumer.ranks, consumer.rows, strict=True):
            start, stop = max(src_start, dst_start), min(src_stop, dst_stop)
            if start < stop and only_src in (None, src) and only_dst in (None, dst):
                routes.append(Route(src, dst, producer.stop, start, stop))
    return routes


def build_stages(specs: list[StageSpec], nproc: int, num_blocks: int, batch_size: int) -> list[Stage]:
    """Validate explicit stages and give each its ranks and row shards."""
    if len(specs) > num_blocks:
        raise PlanError(
            f"{len(specs)} stages but the workload has only {num_blocks} blocks; use at most {num_blocks} stages"
        )
    expected_start = 0
    for index, spec in enumerate(specs):
        if spec.start != expected_start:
            raise PlanError(
                f"schedule.stages[{index}] starts at block {spec.start} but must start at {expected_start}:"
                " stages are contiguous, the first starts at 0 and each starts where the previous stopped"
            )
        expected_start = spec.stop
    if expected_start != num_blocks:
        raise PlanError(
            f"the last stage stops at block {expected_start} but the workload has {num_blocks} blocks;"
            f" the last stage must stop at {num_blocks}"
        )
    total_replicas = sum(spec.replicas for spec in specs)
    if total_replicas != nproc:
        raise PlanError(
            f"stage replicas sum to {total_replicas} but nproc is {nproc}; make them sum to {nproc}"
            f" or run with --nproc {total_replicas}"
        )
    stages, next_rank = [], 0
    for spec in specs:
        ranks = tuple(range(next_rank, next_rank + spec.replicas))
        stages.append(Stage(spec.start, spec.stop, ranks, tuple(shard_rows(batch_size, spec.replicas))))
        next_rank += spec.replicas
    return stages


def describe_rank(plan: Plan, rank: int) -> dict[str, Any]:
    """What one rank does, in words a dashboard can show."""
    if plan.mode == "dp":
        rows = shard_rows(plan.batch_size, plan.nproc)[rank]
        return {"rank": rank, "blocks": list(range(plan.num_blocks)), "rows": rows, "role": "all blocks in turn"}
    if plan.mode == "ls":
        return {"rank": rank, "blocks": plan.assignment[rank], "rows": (0, plan.batch_size), "role": "own blocks"}
    stage = plan.stage_of(rank)
    return {
        "rank": rank,
        "blocks": list(stage.blocks),
        "rows": stage.rows_of(rank),
        "stage": plan.stages.index(stage),
        "role": "replica" if stage.replicas > 1 else "stage",
    }
