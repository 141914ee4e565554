"""The finetune plan (finetune_plan.json): what the finetune phase's ranks follow, and why.

`FinetunePlanDocument` is the file as written (pipebd_core.finetune.plan.TrainPlan is its runtime form,
pipebd_core.planning.finetune_planner writes it): the strategy, each rank's stage of layers, the micro-batches,
every rank's action list, the moved channels, the step counts and the shapes, and `FinetuneDetails`,
the informational part: each layer's FLOPs, the strategy asked for, and with a layer profile the ranked
`StrategyEntry`s and the chosen strategy's `FinetunePredictions`; for a pipeline, the `PartitionEntry`
(the cut, each stage's F/delta/G work, the moves). Every key stays at the top level, as before.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from pipebd_core.documents.base import Document
from pipebd_core.documents.parts import Flat, Part, StepCounts
from pipebd_core.documents.trust import ProfileTrust

Span = tuple[int, int]  # layers [start, stop)
Strategy = Literal["ddp", "gpipe", "1f1b", "zb"]


class TrainSegment(Part):
    """One span of a replayed training step on one rank (pipebd_core.planning.finetune_simulate)."""

    rank: int
    kind: str  # F, B, I, W, allreduce
    microbatch: int | None
    start: float
    end: float


class FinetunePredictions(Part):
    """The chosen strategy's predicted step, each stage's compute seconds and its replayed step."""

    predicted_step_s: float
    predicted_stage_s: list[float]
    simulation: list[TrainSegment]


class StrategyEntry(Flat):
    """One strategy as the planner ranked it: its prediction, or why it cannot run or does not fit."""

    model_config = ConfigDict(extra="forbid")
    OMIT_NONE = ("reason", "stages", "step_s", "stage_s", "bubble", "memory_bytes", "partitioner", "moved", "segments")

    strategy: Strategy
    stages: list[Span] | None = None
    step_s: float | None = None
    stage_s: list[float] | None = None
    bubble: list[float] | None = None  # per rank, the share of the step it waits
    memory_bytes: list[int] | None = None  # per rank, estimated peak
    partitioner: str | None = None
    moved: list[int] | None = None
    fits: bool
    reason: str | None = None  # why it cannot run, or does not fit
    segments: list[TrainSegment] | None = None


class StageWork(Part):
    """A stage's seconds per micro-batch: forward, input gradient (delta), weight gradient, in all."""

    model_config = ConfigDict(extra="forbid", validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)

    forward: float = Field(alias="F")
    delta: float
    weights: float = Field(alias="G")
    total: float


class Move(Part):
    """Channels of a boundary layer whose delta the next stage computes, and the bytes it adds a step."""

    boundary: int
    layer: int
    name: str
    type: str
    share: float
    channels: int
    of: int
    weight_bytes_per_step: int
    grad_bytes_per_step: int


class PartitionCandidate(Part):
    """Partitioner auto: what one partitioner's cut gives the chosen strategy."""

    stages: list[Span]
    moved: list[int]
    step_s: float
    stage_s: list[float]


class PartitionEntry(Flat):
    """The pipeline's cut as the job page shows it (pipebd_core.planning.finetune_search.partition_details)."""

    model_config = ConfigDict(extra="forbid")
    OMIT_NONE = ("target_s", "alpha_rounds", "candidates")

    partitioner: str
    requested: str  # given, or the partitioner the spec asked for
    measured: bool  # False: the seconds are FLOP estimates
    stages: list[Span]
    stage_work_s: list[StageWork]
    moves: list[Move]
    extra_bytes_per_step: int
    layers: list[tuple[float, float, float, bool]]  # F, delta, G per micro-batch; movable
    target_s: float | None = None
    alpha_rounds: int | None = None
    candidates: dict[str, PartitionCandidate] | None = None


class FinetuneDetails(Flat):
    """The informational part of finetune_plan.json: nothing a rank reads to run."""

    model_config = ConfigDict(extra="forbid")
    FLAT = ("predictions",)
    OMIT_NONE = ("strategies", "partition", "profile_trust")

    layer_flops: list[float]
    requested_strategy: str
    strategies: list[StrategyEntry] | None = None  # with a layer profile, fastest first
    predictions: FinetunePredictions | None = None  # with a layer profile
    partition: PartitionEntry | None = None  # pipelines
    profile_trust: ProfileTrust | None = None  # with a layer profile: how far it can be trusted (planning/trust.py)

    @property
    def predicted_step_s(self) -> float | None:
        return self.predictions.predicted_step_s if self.predictions else None


class FinetunePlanDocument(Flat, Document):
    """finetune_plan.json: the finetune phase's schedule and its details."""

    NAME = "finetune_plan.json"
    VERSION = 1
    FLAT = ("steps", "details")

    strategy: Strategy
    nproc: int
    batch_size: int  # the global batch
    microbatches: int
    stages: list[Span]  # per rank, layers [start, stop); ddp: the whole network once
    steps: StepCounts
    shapes: list[list[int]]
    layer_names: list[str]
    input_dtype: Literal["float32", "int64"] = "float32"  # the data's entering layer 0 (int64: token ids)
    actions: list[list[str]]  # pipelines: per rank, in order (pipebd_core.finetune.schedules.Action)
    moved: list[int]
    details: FinetuneDetails
