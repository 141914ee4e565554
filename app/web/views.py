"""View models the templates draw: a job's list row, and its plan as ranks x blocks with stages,
alternatives, per-mode predictions, how far the profile can be trusted, the calibration training
measured and the re-plans."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from app.core.plan_summary import PlanSummary
from app.core.states import PAUSED, PAUSING, QUEUED, RESUMABLE, RUNNING, STARTING
from app.core.tables import Job
from app.web.templating import blocks as block_text
from pipebd_core.documents.calibration import Calibration
from pipebd_core.documents.distill_plan import PlanDocument, Replan, StageSpan
from pipebd_core.documents.phases import DISTILL
from pipebd_core.documents.trust import ProfileTrust

CANCELLABLE = (QUEUED, STARTING, RUNNING, PAUSING, PAUSED)
PAUSABLE = (QUEUED, STARTING, RUNNING)
MODE_ORDER = ("dp", "ls", "ir", "tr", "tr_dpu", "hybrid")


@dataclass
class JobRow:
    job: Job
    elapsed_s: float | None  # running time so far (or in all), or queued time for a queued job
    eta_s: float | None
    plan_text: str
    cancellable: bool
    version: str  # changes whenever the row would render differently
    pausable: bool = False
    resumable: bool = False  # failed, cancelled or paused: POST .../resume may put it back in the queue


def stages_text(stages: Sequence[StageSpan]) -> str:
    """`0 ×2 | 1–3` : each stage's blocks, with its replicas when more than one."""
    parts = []
    for stage in stages:
        text = block_text(range(stage.start, stage.stop))
        parts.append(f"{text} ×{stage.replicas}" if stage.replicas > 1 else text)
    return " | ".join(parts)


def summary_stages(summary: PlanSummary) -> list[StageSpan]:
    """The stages of a job's plan summary (the jobs table's copy of plan.json's mode and stages)."""
    return [
        StageSpan(start=stage["start"], stop=stage["stop"], replicas=stage.get("replicas", 1))
        for stage in summary.get("stages") or []
    ]


# what the plan `auto` chose amounts to, by the mode that runs the same layout
CHOICE_WORDS = {
    "ir": "one stage of every block on every rank, each on its share of the batch",
    "tr_dpu": "one rank per stage, no barrier",
    "hybrid": "stages on one or more ranks each, replicated stages splitting the batch",
}


def chosen_mode(mode: str | None, stages: Sequence[StageSpan]) -> str | None:
    """The mode a plan runs as: its own, or for `auto` the mode of the layout it chose (`ir`: one stage of
    every block on all ranks; `tr_dpu`: one rank per stage; `hybrid`: replicated stages); None before
    `auto` has planned."""
    if mode and mode != "auto":
        return mode
    if not stages:
        return None
    if len(stages) == 1:
        return "ir"
    return "tr_dpu" if all(stage.replicas == 1 for stage in stages) else "hybrid"


def mode_text(job: Job) -> str:
    """The mode as submitted and, for `auto` once planned, what it chose: `dp`, `auto`, `auto → hybrid`."""
    submitted = str(job.spec.get("schedule", {}).get("mode") or "")
    summary = job.plan_summary or {}
    resolved = chosen_mode(summary.get("mode"), summary_stages(summary))
    if not submitted:
        return resolved or "?"
    if resolved is None or resolved == submitted:
        return submitted
    return f"{submitted} → {resolved}"


def plan_detail(job: Job) -> str | None:
    """The plan in a few words without its mode (`0–1 ×2 | 2–3`), None before planning."""
    summary = job.plan_summary
    if not summary:
        return None
    if summary.get("stages"):
        return stages_text(summary_stages(summary))
    if summary.get("mode") == "ls":
        return f"blocks bin-packed on {job.nproc} ranks"
    return f"{job.nproc} ranks, data parallel per block"


def plan_text(job: Job) -> str:
    """The mode and the plan in a few words (`auto → hybrid: 0 ×2 | 1–3`), or, before planning, the
    submitted mode on its ranks."""
    if job.spec.get("workload", {}).get("kind") == "train":  # no distillation: what trains it end to end
        strategy = (job.spec.get("finetune") or {}).get("strategy", "?")
        return f"end to end, {strategy} on {job.nproc} rank{'s' if job.nproc != 1 else ''}"
    detail = plan_detail(job)
    if detail is None:
        mode = job.spec.get("schedule", {}).get("mode", "?")
        suffix = ", planned when it starts" if mode == "auto" else ""
        return f"{mode} on {job.nproc} rank{'s' if job.nproc != 1 else ''}{suffix}"
    return f"{mode_text(job)}: {detail}"


def job_row(job: Job, now: float | None = None) -> JobRow:
    now = now or time.time()
    elapsed: float | None
    if job.started_at is not None:
        elapsed = (job.finished_at or now) - job.started_at
    elif job.state == QUEUED:
        elapsed = now - job.created_at
    else:
        elapsed = None
    eta = None
    if job.state == RUNNING and elapsed is not None and 0.0 < job.progress < 1.0:
        eta = elapsed * (1.0 - job.progress) / job.progress
    version = f"{job.state}:{job.phase}:{job.updated_at}:{job.progress:.4f}:{job.samples_per_s}"
    row = JobRow(job, elapsed, eta, plan_text(job), job.state in CANCELLABLE, version)
    return replace(row, pausable=job.state in PAUSABLE, resumable=job.state in RESUMABLE)


@dataclass(frozen=True)
class PhaseStep:
    """One phase on a job's timeline: `profile 12 s`, with how it went."""

    name: str
    status: str  # pending, running, or the outcome: succeeded, failed, cancelled, skipped
    duration_s: float | None
    reason: str | None
    notes: list[str] = field(default_factory=list)  # what happened inside it (distill: each re-plan)


def phase_timeline(job: Job, now: float | None = None, replans: Sequence[Replan] = ()) -> list[PhaseStep]:
    """The job's phases in order with their durations so far (a running phase's up to `now`); the distill
    phase notes each re-plan of plan.json's `replans`."""
    now = now or time.time()
    steps = []
    for entry in job.phases or []:
        started, ended = entry.get("started_at"), entry.get("ended_at")
        duration = None if started is None else (ended or now) - started
        status = entry.get("outcome") or entry.get("state", "pending")
        notes = [replan_note(r) for r in replans] if entry["name"] == DISTILL else []
        steps.append(PhaseStep(entry["name"], status, duration, entry.get("reason"), notes))
    return steps


def replan_note(replan: Replan) -> str:
    return f"re-planned at step {replan.resumed_at_step}: {stages_text(replan.to)}"


@dataclass
class ReplanView:
    """One re-plan of a running job, as its plan.json history records it."""

    step: int
    before: str
    after: str
    measured_before_s: float
    predicted_before_s: float
    predicted_after_s: float | None
    measured_after_s: float | None
    reason: str


@dataclass
class BlockCalibration:
    """One block's measured time against its profiled time (ratio > 1: training ran slower)."""

    block: int
    name: str
    teacher: float | None
    student: float | None
    teacher_s: float | None
    student_s: float | None


@dataclass
class Cell:
    owned: bool
    rows: tuple[int, int] | None = None


@dataclass
class RankRow:
    rank: int
    role: str
    stage: int | None
    rows: tuple[int, int]
    cells: list[Cell]


@dataclass
class StageView:
    index: int
    blocks: str
    ranks: list[int]
    rows: list[tuple[int, int]]

    @property
    def replicas(self) -> int:
        return len(self.ranks)


@dataclass
class Alternative:
    position: int
    stages: str
    step_s: float
    bottleneck_stage: int | None
    relative: float  # step time over the best alternative's
    chosen: bool


@dataclass
class PlanView:
    mode: str
    chosen: str | None  # the mode the plan runs as (for auto: the layout it chose)
    nproc: int
    batch_size: int
    block_names: list[str]
    rank_rows: list[RankRow]
    stages: list[StageView]
    alternatives: list[Alternative] = field(default_factory=list)
    mode_steps: list[tuple[str, float, float | None]] = field(default_factory=list)  # mode, step, speed-up vs dp
    predicted_step_s: float | None = None
    ideal_step_s: float | None = None
    warnings: list[str] = field(default_factory=list)
    trust: ProfileTrust | None = None  # trust.assess of the profile the plan was made from
    replans: list[ReplanView] = field(default_factory=list)
    calibration: list[BlockCalibration] = field(default_factory=list)
    calibrated_steps: list[int] | None = None  # the steps the calibration measured
    measured_step_s: float | None = None  # the job's measured step (app/core/figures.py)

    @property
    def auto_choice(self) -> str | None:
        """For `auto`, the layout it chose in words."""
        return CHOICE_WORDS.get(self.chosen or "") if self.mode == "auto" else None


def _rank_rows(plan: PlanDocument) -> list[RankRow]:
    rows = []
    for info in plan.ranks:
        owned = set(info.blocks)
        cells = [Cell(block in owned, info.rows if block in owned else None) for block in range(plan.num_blocks)]
        rows.append(RankRow(info.rank, info.role, info.stage, info.rows, cells))
    return rows


def _alternatives(plan: PlanDocument) -> list[Alternative]:
    ranked = plan.predictions.alternatives if plan.predictions else []
    if not ranked:
        return []
    best = ranked[0].step_s or 1e-12
    chosen = plan.stage_triples()
    return [
        Alternative(
            position=index + 1,
            stages=stages_text(item.stages),
            step_s=item.step_s,
            bottleneck_stage=item.bottleneck_stage,
            relative=item.step_s / best,
            chosen=item.triples() == chosen,
        )
        for index, item in enumerate(ranked)
    ]


def _mode_steps(plan: PlanDocument) -> list[tuple[str, float, float | None]]:
    steps = plan.predictions.mode_step_s if plan.predictions else {}
    baseline = steps.get("dp")
    return [
        (mode, steps[mode], baseline / steps[mode] if baseline and steps[mode] else None)
        for mode in MODE_ORDER
        if mode in steps
    ]


def replan_views(plan: PlanDocument) -> list[ReplanView]:
    return [
        ReplanView(
            step=entry.resumed_at_step,
            before=stages_text(entry.from_),
            after=stages_text(entry.to),
            measured_before_s=entry.measured_before_s,
            predicted_before_s=entry.predicted_before_s,
            predicted_after_s=entry.predicted_after_s,
            measured_after_s=entry.measured_after_s,
            reason=entry.reason,
        )
        for entry in plan.details.replans
    ]


def calibration_views(calibration: Calibration | None, names: list[str]) -> list[BlockCalibration]:
    blocks = calibration.blocks if calibration else []
    return [
        BlockCalibration(
            index,
            names[index] if index < len(names) else f"block{index}",
            entry.teacher,
            entry.student,
            entry.teacher_s,
            entry.student_s,
        )
        for index, entry in enumerate(blocks)
    ]


def plan_view(
    plan: PlanDocument, calibration: Calibration | None = None, measured_step_s: float | None = None
) -> PlanView:
    """The plan part; `measured_step_s`: the job's measured step (app/core/figures.py), the one the bottleneck
    part quotes too."""
    names = plan.block_names or [f"block{i}" for i in range(plan.num_blocks)]
    stages = [
        StageView(index, block_text(range(s.start, s.stop)), list(s.ranks), list(s.rows))
        for index, s in enumerate(plan.stages)
    ]
    predictions = plan.predictions
    return PlanView(
        mode=plan.mode,
        chosen=chosen_mode(plan.mode, plan.stages),
        nproc=plan.nproc,
        batch_size=plan.batch_size,
        block_names=names,
        rank_rows=_rank_rows(plan),
        stages=stages,
        alternatives=_alternatives(plan),
        mode_steps=_mode_steps(plan),
        predicted_step_s=predictions.predicted_step_s if predictions else None,
        ideal_step_s=predictions.ideal_step_s if predictions else None,
        warnings=plan.details.warnings or [],
        trust=plan.details.profile_trust,
        replans=replan_views(plan),
        calibration=calibration_views(calibration, names),
        calibrated_steps=calibration.source.steps if calibration else None,
        measured_step_s=measured_step_s,
    )
