"""The job page's end-to-end training part: what the finetune plan chose (strategy, stages, micro-batches,
predicted step), the strategies the planner ranked, and top-1 (a language model's held-out perplexity)
before, after and of the teacher."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.core.summaries import read_summary
from app.core.tables import Job
from app.web import queries
from pipebd_core.documents.base import DocumentError
from pipebd_core.documents.finetune_plan import FinetunePlanDocument
from pipebd_core.documents.summary import FinetuneReport
from pipebd_core.spec import WorkloadSpec


def has_finetune(job: Job) -> bool:
    return job.spec.get("finetune") is not None or job.spec.get("workload", {}).get("kind") == "train"


def language_model(job: Job) -> bool:
    """Whether the job trains a language model, whose evaluations are held-out perplexity, not top-1."""
    try:
        return WorkloadSpec.model_validate(job.spec.get("workload", {})).language_model
    except ValueError:  # a spec stored before a field it names existed: shown as a classifier's
        return False


def trains_blocks(job: Job) -> bool:
    """Whether the job distils at all (a kind train job only trains end to end)."""
    return job.spec.get("workload", {}).get("kind") != "train"


@dataclass
class StrategyRow:
    strategy: str
    step_s: float | None
    bubble: list[float]
    memory_bytes: int | None
    fits: bool
    reason: str | None
    chosen: bool


@dataclass
class FinetuneView:
    requested: str
    strategy: str | None  # None until the plan_finetune phase wrote the plan
    stages: list[tuple[int, int]] = field(default_factory=list)
    layer_names: list[str] = field(default_factory=list)
    microbatches: int = 1
    predicted_step_s: float | None = None
    strategies: list[StrategyRow] = field(default_factory=list)
    report: FinetuneReport | None = None  # summary.json's `finetune` section, once evaluated
    error: str | None = None  # why finetune_plan.json could not be read (another version wrote it)

    def stage_text(self, index: int) -> str:
        start, stop = self.stages[index]
        first, last = self.layer_names[start], self.layer_names[stop - 1]
        return f"layers {start}–{stop - 1} ({first} … {last})" if stop - start > 1 else f"layer {start} ({first})"


def read_plan(job: Job) -> FinetunePlanDocument | None:
    """The job's finetune_plan.json, None until written (DocumentError: another version wrote it)."""
    return queries.read_document(job, "finetune_plan.json", FinetunePlanDocument)


def finetune_view(job: Job) -> FinetuneView:
    requested = str((job.spec.get("finetune") or {}).get("strategy", "auto"))
    summary = read_summary(job)
    report = summary.finetune if summary is not None else None
    try:
        plan = read_plan(job)
    except DocumentError as error:
        return FinetuneView(requested, None, report=report, error=str(error))
    if plan is None:
        return FinetuneView(requested, None, report=report)
    rows = [
        StrategyRow(
            strategy=entry.strategy,
            step_s=entry.step_s,
            bubble=entry.bubble or [],
            memory_bytes=max(entry.memory_bytes) if entry.memory_bytes else None,
            fits=entry.fits,
            reason=entry.reason,
            chosen=entry.strategy == plan.strategy,
        )
        for entry in plan.details.strategies or []
    ]
    return FinetuneView(
        requested=requested,
        strategy=plan.strategy,
        stages=list(plan.stages),
        layer_names=plan.layer_names,
        microbatches=plan.microbatches,
        predicted_step_s=plan.details.predicted_step_s,
        strategies=rows,
        report=report,
    )


def predicted_schedule(job: Job) -> list[dict[str, Any]]:
    """The planner's replay of the chosen strategy's step (Gantt segments), empty without a profile."""
    try:
        plan = read_plan(job)
    except DocumentError:
        return []  # the finetune part says why
    predictions = plan.details.predictions if plan else None
    return [segment.to_json() for segment in predictions.simulation] if predictions else []
