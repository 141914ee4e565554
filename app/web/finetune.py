"""The job page's end-to-end training part: what the finetune plan chose (strategy, stages, micro-batches,
predicted step), the strategies the planner ranked, and top-1 before, after and of the teacher."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.core.tables import Job
from app.web import queries


def has_finetune(job: Job) -> bool:
    return job.spec.get("finetune") is not None or job.spec.get("workload", {}).get("kind") == "train"


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
    report: dict[str, Any] | None = None  # summary.json's `finetune` section, once evaluated

    def stage_text(self, index: int) -> str:
        start, stop = self.stages[index]
        first, last = self.layer_names[start], self.layer_names[stop - 1]
        return f"layers {start}–{stop - 1} ({first} … {last})" if stop - start > 1 else f"layer {start} ({first})"


def finetune_view(job: Job) -> FinetuneView:
    requested = str((job.spec.get("finetune") or {}).get("strategy", "auto"))
    plan = queries.read_json_artifact(job, "finetune_plan.json")
    report = (queries.read_json_artifact(job, "summary.json") or {}).get("finetune")
    if plan is None:
        return FinetuneView(requested, None, report=report)
    rows = [
        StrategyRow(
            strategy=entry["strategy"],
            step_s=entry.get("step_s"),
            bubble=entry.get("bubble", []),
            memory_bytes=max(entry["memory_bytes"]) if entry.get("memory_bytes") else None,
            fits=bool(entry["fits"]),
            reason=entry.get("reason"),
            chosen=entry["strategy"] == plan["strategy"],
        )
        for entry in plan.get("strategies", [])
    ]
    return FinetuneView(
        requested=requested,
        strategy=plan["strategy"],
        stages=[(int(a), int(b)) for a, b in plan["stages"]],
        layer_names=plan.get("layer_names", []),
        microbatches=int(plan["microbatches"]),
        predicted_step_s=plan.get("predicted_step_s"),
        strategies=rows,
        report=report,
    )


def predicted_schedule(job: Job) -> list[dict[str, Any]]:
    """The planner's replay of the chosen strategy's step (Gantt segments), empty without a profile."""
    plan = queries.read_json_artifact(job, "finetune_plan.json") or {}
    return list(plan.get("simulation") or [])
