"""Filled-in plan documents for tests/unit/test_documents.py: a profiled, re-planned plan.json and a
profiled pipeline's finetune_plan.json with moved channels."""

from __future__ import annotations

from pipebd_core.documents.distill_plan import (
    Estimates,
    PlanDetails,
    PlanDocument,
    Predictions,
    RankedEntry,
    RankEntry,
    Replan,
    RouteEntry,
    Segment,
    StageEntry,
    StageParts,
    StageSpan,
    Timeline,
)
from pipebd_core.documents.finetune_plan import (
    FinetuneDetails,
    FinetunePlanDocument,
    FinetunePredictions,
    Move,
    PartitionCandidate,
    PartitionEntry,
    StageWork,
    StrategyEntry,
    TrainSegment,
)
from pipebd_core.documents.parts import SearchEntry, StepCounts, StreamEntry, Streams
from pipebd_core.documents.trust import ProfileTrust

FIRST = StageEntry(start=0, stop=1, replicas=2, ranks=[0, 1], rows=[(0, 4), (4, 8)])
SECOND = StageEntry(start=1, stop=3, replicas=1, ranks=[2], rows=[(0, 8)])
PARTS = StageParts(input_s=0.001, compute_s=0.01, allreduce_s=0.002, overhead_s=0.0)
RANKED = RankedEntry(
    stages=[StageSpan(start=0, stop=1, replicas=2), StageSpan(start=1, stop=3, replicas=1)],
    step_s=0.013,
    bottleneck_stage=1,
    stage_s=[0.011, 0.013],
    stage_parts=[PARTS, PARTS],
    memory_bytes=[2**20, 2**21],
)
TIMELINE = Timeline(
    step_s=0.014,
    segments=[Segment(rank=0, kind="teacher", block=0, step=0, start=0.0, end=0.004, round="weights")],
)
PLAN_SAMPLE = PlanDocument(
    mode="auto",
    nproc=3,
    num_blocks=3,
    batch_size=8,
    stages=[FIRST, SECOND],
    routes=[
        RouteEntry(src=0, dst=2, boundary=1, start=0, stop=4),
        RouteEntry(src=1, dst=2, boundary=1, start=4, stop=8),
    ],
    ranks=[
        RankEntry(rank=0, blocks=[0], rows=(0, 4), stage=0, role="replica"),
        RankEntry(rank=2, blocks=[1, 2], rows=(0, 8), stage=1, role="stage"),
    ],
    steps=StepCounts(
        total_steps=40,
        steps_per_epoch=10,
        num_samples=80,
        streams=Streams(weights=StreamEntry(name="train", first=0, count=80), arch=None),
        search=SearchEntry(from_step=4, every=2),
    ),
    shapes=[[1, 8, 8], [4, 8, 8], [8, 4, 4], [10]],
    block_names=["conv1", "conv2", "head"],
    details=PlanDetails(
        estimates=Estimates(
            shapes=[[1, 8, 8], [4, 8, 8], [8, 4, 4], [10]],
            teacher_flops=[1e6, 2e6, 1e5],
            student_flops=[5e5, 1e6, 1e5],
            student_params=[100, 200, 30],
            teacher_params=[400, 800, 30],
        ),
        warnings=["the teacher is untrained"],
        predictions=Predictions(
            predicted_step_s=0.014,
            ideal_step_s=0.009,
            mode_step_s={"dp": 0.03, "hybrid": 0.014},
            alternatives=[RANKED],
            plans_considered=12,
            stages_rejected_for_memory=1,
            simulation={"chosen": TIMELINE, "hybrid": TIMELINE},
        ),
        profile_trust=ProfileTrust(
            trusted=False,
            flags=["busy"],
            messages=["busy: ..."],
            noisy=[],
            other_cpu_cores=0.9,
            age_s=None,
            calibrated_from=None,
        ),
        replans=[
            Replan(
                at=1700000000.5,
                decided_at_step=11,
                resumed_at_step=12,
                from_=[StageEntry(start=0, stop=3, replicas=3, ranks=[0, 1, 2], rows=[(0, 3), (3, 6), (6, 8)])],
                to=[FIRST, SECOND],
                measured_before_s=0.03,
                predicted_before_s=0.02,
                predicted_after_s=0.014,
                measured_after_s=None,
                reason="measured 50% off the prediction; a plan 40% faster",
            )
        ],
    ),
)

MOVE = Move(
    boundary=0,
    layer=2,
    name="features.4",
    type="Conv2d",
    share=0.25,
    channels=16,
    of=64,
    weight_bytes_per_step=9216,
    grad_bytes_per_step=65536,
)
WORK = StageWork(forward=0.002, delta=0.001, weights=0.001, total=0.004)
REPLAY = [TrainSegment(rank=0, kind="F", microbatch=0, start=0.0, end=0.002)]
FINETUNE_SAMPLE = FinetunePlanDocument(
    strategy="1f1b",
    nproc=2,
    batch_size=8,
    microbatches=2,
    stages=[(0, 3), (3, 5)],
    steps=StepCounts(
        total_steps=10,
        steps_per_epoch=5,
        num_samples=40,
        streams=Streams(weights=StreamEntry(name="train", first=0, count=40), arch=None),
        search=None,
    ),
    shapes=[[3, 8, 8], [16, 8, 8], [16, 4, 4], [32, 4, 4], [32], [10]],
    layer_names=["conv1", "conv2", "conv3", "pool", "fc"],
    actions=[["F0", "F1", "B0", "B1"], ["F0", "B0", "F1", "B1"]],
    moved=[16],
    details=FinetuneDetails(
        layer_flops=[1e5, 2e5, 2e5, 1e3, 3e3],
        requested_strategy="auto",
        strategies=[
            StrategyEntry(
                strategy="1f1b",
                stages=[(0, 3), (3, 5)],
                step_s=0.01,
                stage_s=[0.008, 0.006],
                bubble=[0.2, 0.4],
                memory_bytes=[2**20, 2**19],
                partitioner="pipedream",
                moved=[16],
                fits=True,
                segments=REPLAY,
            ),
            StrategyEntry(strategy="zb", fits=False, reason="zb needs at least 2 micro-batches, the spec has 1"),
        ],
        predictions=FinetunePredictions(predicted_step_s=0.01, predicted_stage_s=[0.008, 0.006], simulation=REPLAY),
        partition=PartitionEntry(
            partitioner="pipedream",
            requested="auto",
            measured=True,
            stages=[(0, 3), (3, 5)],
            stage_work_s=[WORK, WORK],
            moves=[MOVE],
            extra_bytes_per_step=74752,
            layers=[(0.001, 0.0005, 0.0005, True), (0.001, 0.0005, 0.0005, False)],
            target_s=0.004,
            alpha_rounds=3,
            candidates={
                "pipedream": PartitionCandidate(
                    stages=[(0, 3), (3, 5)], moved=[16], step_s=0.01, stage_s=[0.008, 0.006]
                )
            },
        ),
    ),
)
