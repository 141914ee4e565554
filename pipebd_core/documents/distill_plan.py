"""The distillation plan (plan.json): the schedule the ranks follow, and what the planner says about it.

`PlanDocument` is plan.json as written: the schedule (mode, stages, routes, each rank's part, the step
counts, the block shapes; pipebd_core.distill.plan.Plan is its runtime form) and `PlanDetails`, the
informational part: the probe's estimates, the workload's warnings, and for a profiled job the
planner's `Predictions` (the chosen plan's simulated step, the ideal bound, every mode's step, the
ranked alternatives, the simulated timelines), how far the profile can be trusted (`ProfileTrust`), and the history
of re-plans (`Replan`). Every key stays at the top level of plan.json, as before it was typed.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ConfigDict, Field

from pipebd_core.documents.base import Document
from pipebd_core.documents.parts import Flat, Part, StepCounts
from pipebd_core.documents.trust import ProfileTrust

Rows = tuple[int, int]  # [start, stop) rows of the global batch


class StageSpan(Part):
    """A stage as the planner ranks it: blocks [start, stop) on `replicas` ranks."""

    start: int
    stop: int
    replicas: int

    def triple(self) -> tuple[int, int, int]:
        return (self.start, self.stop, self.replicas)


def stages_line(stages: Sequence[StageSpan]) -> str:
    """`0-2 x1 | 3-7 x1`: each stage's blocks and replicas, as `pipebd plan` writes them."""
    return " | ".join(f"{s.start}-{s.stop - 1} x{s.replicas}" for s in stages)


class StageEntry(StageSpan):
    """A pipeline stage of the plan: its span, its ranks and each replica's rows."""

    ranks: list[int]
    rows: list[Rows]


class RouteEntry(Part):
    """Rows [start, stop) sent from rank `src` to rank `dst` at block boundary `boundary`."""

    src: int
    dst: int
    boundary: int
    start: int
    stop: int
    crosses_nodes: bool = False  # src and dst are on different nodes: the send takes the slower link


class RankEntry(Flat):
    """What one rank does, in words a dashboard can show (`stage` in pipeline modes only)."""

    model_config = ConfigDict(extra="forbid")
    OMIT_NONE = ("stage",)

    rank: int
    blocks: list[int]
    rows: Rows
    stage: int | None = None
    role: str  # stage, replica, own blocks (ls), all blocks in turn (dp)


class Estimates(Part):
    """The probe's per-block numbers, per sample (pipebd_core.workloads.probe.BlockProbe)."""

    shapes: list[list[int]]
    teacher_flops: list[float]
    student_flops: list[float]
    student_params: list[int]
    teacher_params: list[int]


class StageParts(Part):
    input_s: float
    compute_s: float
    allreduce_s: float
    overhead_s: float


class RankedEntry(Part):
    """One plan of the planner's ranking (pipebd_core.planning.distill_search.RankedPlan.entry)."""

    stages: list[StageSpan]
    step_s: float
    bottleneck_stage: int | None
    stage_s: list[float]
    stage_parts: list[StageParts]
    memory_bytes: list[int]

    def triples(self) -> list[tuple[int, int, int]]:
        return [stage.triple() for stage in self.stages]


class Segment(Part):
    """One span of simulated time on one rank (pipebd_core.planning.distill_simulate.Segment)."""

    rank: int
    kind: str  # data | recv_wait | recv | teacher | student | allreduce | barrier
    block: int | None
    step: int
    start: float
    end: float
    round: str = "weights"


class Timeline(Part):
    """A simulated run of a few steps: its step time and every segment."""

    step_s: float
    segments: list[Segment]


class Predictions(Part):
    """What the planner predicts from a profile (pipebd_core.planning.distill_planner.predictions)."""

    predicted_step_s: float  # the chosen plan, simulated
    ideal_step_s: float  # the lower bound on a step
    mode_step_s: dict[str, float]  # every mode's simulated step
    alternatives: list[RankedEntry]  # the best plans found, ranked
    plans_considered: int  # plans that fit in memory
    stages_rejected_for_memory: int
    simulation: dict[str, Timeline]  # per mode and `chosen`

    def ranked(self, stages: list[tuple[int, int, int]]) -> RankedEntry | None:
        """The alternative with these stages, when the planner ranked it."""
        return next((plan for plan in self.alternatives if plan.triples() == stages), None)


class Replan(Part):
    """One re-plan of a running job (pipebd_core.job.replan): when, from which stages to which, and the
    step times predicted and measured before and after."""

    model_config = ConfigDict(extra="forbid", validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)

    at: float  # when it was decided (seconds since the epoch)
    decided_at_step: int
    resumed_at_step: int  # the step every block resumed from under the new plan
    from_: list[StageEntry] = Field(alias="from")
    to: list[StageEntry]
    measured_before_s: float
    predicted_before_s: float
    predicted_after_s: float | None
    measured_after_s: float | None  # the first calibration under the new plan fills it in
    reason: str


class PlanDetails(Flat):
    """The informational part of plan.json: nothing a rank reads to run."""

    model_config = ConfigDict(extra="forbid")
    FLAT = ("predictions",)
    OMIT_NONE = ("estimates", "warnings", "profile_trust")
    OMIT_EMPTY = ("replans",)  # plan.json has `replans` once the job has re-planned

    estimates: Estimates | None = None
    warnings: list[str] | None = None  # what the workload factory warned about
    predictions: Predictions | None = None  # profiled jobs
    profile_trust: ProfileTrust | None = None  # pipebd_core.planning.trust.assess of the profile
    replans: list[Replan] = []

    @property
    def predicted_step_s(self) -> float | None:
        return self.predictions.predicted_step_s if self.predictions else None


class PlanDocument(Flat, Document):
    """plan.json: the schedule of one job and its details."""

    NAME = "plan.json"
    VERSION = 1
    FLAT = ("steps", "details")

    mode: str
    nproc: int  # ranks in all
    nodes: int = 1  # nproc / nodes ranks on each node, consecutive
    num_blocks: int
    batch_size: int
    stages: list[StageEntry] = []  # pipeline modes
    routes: list[RouteEntry] = []
    assignment: list[list[int]] = []  # ls: blocks per rank
    ranks: list[RankEntry] = []
    steps: StepCounts | None = None  # None only in plans built for the planner's comparisons
    shapes: list[list[int]] = []
    block_names: list[str] = []
    details: PlanDetails = PlanDetails()

    def stage_triples(self) -> list[tuple[int, int, int]]:
        return [stage.triple() for stage in self.stages]

    @property
    def predictions(self) -> Predictions | None:
        return self.details.predictions

    @property
    def total_steps(self) -> int:
        assert self.steps is not None, "a plan the runtime follows has its step counts"
        return self.steps.total_steps

    def rank(self, rank: int) -> RankEntry | None:
        return next((entry for entry in self.ranks if entry.rank == rank), None)
