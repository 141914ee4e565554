"""A sweep's objective: what it is (`Objective`, part of `POST /api/v1/sweeps`), the summary metric of each
child, and which child is best so far. In app/core because a child's end settles its sweep's best
(app/core/sweep_events.py) in the transaction of its move.

| metric | read from | |
|---|---|---|
| `final_loss` | summary.json `final_loss` | the mean of the blocks' losses at their last checkpoint |
| `student_top1` | summary.json `student_top1` | the compressed student's top-1 (labelled data only) |
| `finetune_top1` | summary.json `finetune.top1_after` | top-1 after end-to-end training |
| `perplexity` | summary.json `student_perplexity` | a language model's held-out perplexity, distilled or searched |
| `finetune_perplexity` | summary.json `finetune.perplexity_after` | the same after end-to-end training |
| `samples_per_s` | the job's measured throughput | known while a child runs, so a running child can lead |

A child without the metric yet (queued, still training, no labels), or whose value is not a finite number (a
diverged loss), has no value and is never the best.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.core.summaries import read_summary
from app.core.tables import Job
from pipebd_core.documents.summary import Summary

Metric = Literal["final_loss", "student_top1", "finetune_top1", "perplexity", "finetune_perplexity", "samples_per_s"]


class Objective(BaseModel):
    """What makes one child better than another: a summary metric, lower or higher."""

    model_config = ConfigDict(extra="forbid", strict=True)

    metric: Metric = Field(
        description="final_loss (the mean of the blocks' final losses), student_top1 (the compressed student's"
        " top-1), finetune_top1 (top-1 after end-to-end training), perplexity (a language model's held-out"
        " perplexity, distilled or searched), finetune_perplexity (the same after end-to-end training) or samples_per_s"
        " (measured throughput)"
    )
    goal: Literal["minimize", "maximize"] = Field(description="whether lower or higher is better")


def final_loss(summary: Summary) -> float | None:
    losses = list((summary.final_loss or {}).values())
    return sum(losses) / len(losses) if losses else None


def finetune_top1(summary: Summary) -> float | None:
    return summary.finetune.top1_after if summary.finetune is not None else None


def finetune_perplexity(summary: Summary) -> float | None:
    return summary.finetune.perplexity_after if summary.finetune is not None else None


FROM_SUMMARY: dict[str, Callable[[Summary], float | None]] = {
    "final_loss": final_loss,
    "student_top1": lambda summary: summary.student_top1,
    "finetune_top1": finetune_top1,
    "perplexity": lambda summary: summary.student_perplexity,
    "finetune_perplexity": finetune_perplexity,
}


def metric_value(job: Job, metric: str) -> float | None:
    """The child's value of `metric` now; None while it has none, or when it is not a number (a diverged
    training's NaN loss never leads)."""
    if metric == "samples_per_s":
        value = job.samples_per_s
    else:
        summary = read_summary(job)
        value = None if summary is None else FROM_SUMMARY[metric](summary)
    return value if value is not None and math.isfinite(value) else None


@dataclass(frozen=True)
class Best:
    job_id: int
    value: float


def best_of(values: dict[int, float | None], objective: Objective) -> Best | None:
    """The child with the lowest (minimize) or highest (maximize) value; the older child on a tie."""
    known = [(job_id, value) for job_id, value in sorted(values.items()) if value is not None]
    if not known:
        return None
    sign = 1.0 if objective.goal == "minimize" else -1.0
    job_id, value = min(known, key=lambda item: sign * item[1])
    return Best(job_id, value)
