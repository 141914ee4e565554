"""What the jobs table keeps of a job's plan.json (`Job.plan_summary`): written by the worker once the plan is
resolved, read by the API (a job's detail), the dashboard and comparisons. One shape, written here.

A summary stored by an older worker may lack keys: every key is optional to a reader.
"""

from __future__ import annotations

from typing_extensions import TypedDict  # pydantic reads TypedDicts from typing_extensions on Python 3.11

from app.core.json_types import JsonObject
from pipebd_core.documents.distill_plan import PlanDocument

Number = int | float  # as plan.json has it: an integer stays one


class PlanSummary(TypedDict, total=False):
    """Mode, shape and predicted step time of a job's resolved plan (the whole plan is plan.json)."""

    mode: str  # the schedule the plan resolved to (`auto` resolves to one of the others)
    nproc: int
    num_blocks: int
    batch_size: int
    stages: list[JsonObject] | None  # plan.json's stages (pipeline modes): `start`, `stop`, `ranks`, `rows`
    assignment: list[list[int]] | None  # ls: the blocks of each rank
    total_steps: int | None
    block_names: list[str] | None  # None: plan.json left them out
    predicted_step_s: Number | None  # profiled plans only
    mode_step_s: dict[str, Number] | None  # profiled plans only


def summarize(plan: PlanDocument) -> PlanSummary:
    """The summary of `plan` as the jobs table keeps it: each key as plan.json has it (None where it left one
    out: an empty list or no value)."""
    whole = plan.to_json()
    summary = PlanSummary(
        mode=whole["mode"],
        nproc=whole["nproc"],
        num_blocks=whole["num_blocks"],
        batch_size=whole["batch_size"],
        stages=whole.get("stages"),
        assignment=whole.get("assignment"),
        total_steps=whole.get("total_steps"),
        block_names=whole.get("block_names"),
    )
    if plan.predictions is not None:
        summary["predicted_step_s"] = whole.get("predicted_step_s")
        summary["mode_step_s"] = whole.get("mode_step_s")
    return summary


def cut(summary: PlanSummary) -> str:
    """The plan in a few characters, as the attempts list shows it: each stage's blocks (`0-6 | 7-12`, with `x2`
    after a stage two ranks share), or the mode of a plan without stages (`dp`, `ls`)."""
    stages = summary.get("stages")
    if not stages:
        return str(summary.get("mode", "?"))
    parts = []
    for stage in stages:
        start, stop, ranks = int(stage["start"]), int(stage["stop"]), stage.get("ranks")
        blocks = str(start) if stop - start == 1 else f"{start}-{stop - 1}"
        replicas = len(ranks) if isinstance(ranks, list) else 1
        parts.append(blocks if replicas == 1 else f"{blocks} x{replicas}")
    return " | ".join(parts)
