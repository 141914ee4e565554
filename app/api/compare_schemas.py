"""The response shapes of `GET /api/v1/compare` (docs/api.md): one row a job, its spec fields and its
figures as the job's own answer gives them (app/core/figures.py); the jobs' are app/api/schemas.py."""

from __future__ import annotations

from pydantic import BaseModel, Field

from app.api.schemas import Number
from app.core.json_types import JsonObject
from app.core.states import JobState


class LossStat(BaseModel):
    """One block's loss: the lowest and highest its telemetry recorded, and the final one."""

    min: Number | None = Field(description="the lowest loss of any telemetry line; null before any line")
    max: Number | None = Field(description="the highest loss of any telemetry line; null before any line")
    final: Number | None = Field(description="at the block's last checkpoint (summary.json); null until written")


class CompareRow(BaseModel):
    """One job of a comparison: its spec fields shown, and its summary columns."""

    id: int = Field(description="the job's id")
    name: str = Field(description="the spec's name")
    state: JobState = Field(description="the job's state now")
    sweep_id: int | None = Field(description="the sweep it is a child of; null for none")
    fields: JsonObject = Field(
        description="dotted spec path -> this job's value (null where its spec lacks the field), for each of `fields`"
    )
    loss: dict[str, LossStat] = Field(description="per block (its index): the loss's min, max and final")
    samples_per_s: float | None = Field(description="the job's samples/s, as GET /api/v1/jobs/{id} gives it")
    step_s: float | None = Field(None, description="the job's measured step, as GET /api/v1/jobs/{id} gives it")
    busy_share: float | None = Field(None, description="the job's busy share, as GET /api/v1/jobs/{id} gives it")
    peak_mem: int | None = Field(None, description="the job's peak memory in bytes, as GET /api/v1/jobs/{id} gives it")
    top1: Number | None = Field(
        description="top-1 after end-to-end training, else the compressed student's; null where none was measured"
    )
    perplexity: Number | None = Field(
        None,
        description="a language model's held-out perplexity, after fine-tuning where it was, else the distilled"
        " or searched network's; else null",
    )


class ComparePage(BaseModel):
    """A page of a comparison of any number of jobs, sorted on the server."""

    total: int = Field(description="jobs selected in all")
    offset: int = Field(description="rows of the sorted selection before this page")
    limit: int = Field(description="rows per page, as asked")
    next_offset: int | None = Field(description="pass as `offset` for the next page; null on the last page")
    sort: str = Field(description="the sort column, `-` before it for descending (ties: by id)")
    all_fields: bool = Field(description="true: every spec field is a column; false: only the ones that differ")
    fields: list[str] = Field(description="the spec columns of every row, as dotted paths, sorted")
    differing: list[str] = Field(description="the spec fields whose value is not the same in every selected job")
    data: list[CompareRow] = Field(description="at most `limit` rows")
