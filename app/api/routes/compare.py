"""Comparison: any number of jobs (ids, a sweep's children, a state or a name), sorted and paged on the
server, with the spec fields that differ and each job's summary columns (app/services/compare.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.api.compare_schemas import ComparePage, CompareRow, LossStat
from app.api.deps import PageSize, ReadAccess, SessionDep
from app.api.schemas import AUTH_ERRORS, problem
from app.core.figures import step_of
from app.core.states import JobState
from app.core.tables import DB_INT_MAX, Sweep
from app.services.compare import SORT_NAMES, CompareError, Comparison, Selection, compare, parse_ids
from app.services.errors import ServiceError, invalid

router = APIRouter(tags=["jobs"], responses=AUTH_ERRORS)


def page_of(comparison: Comparison) -> ComparePage:
    rows = [
        CompareRow(
            id=row.job.id or 0,
            name=row.job.name,
            state=row.job.state,
            sweep_id=row.job.sweep_id,
            fields=row.fields,
            loss={block: LossStat(**vars(stat)) for block, stat in row.loss.items()},
            samples_per_s=row.job.samples_per_s,
            step_s=step_of(row.job),
            busy_share=row.job.busy_share,
            peak_mem=row.job.peak_mem,
            top1=row.top1,
            perplexity=row.perplexity,
        )
        for row in comparison.rows
    ]
    return ComparePage(
        total=comparison.total,
        offset=comparison.offset,
        limit=comparison.limit,
        next_offset=comparison.next_offset,
        sort=comparison.sort,
        all_fields=comparison.all_fields,
        fields=comparison.fields,
        differing=comparison.differing,
        data=rows,
    )


@router.get(
    "/compare",
    response_model=ComparePage,
    dependencies=[ReadAccess],
    responses={
        404: problem("`sweep_id` names no sweep"),
        422: problem("a bad `ids` list (not job ids, or too many), an unknown `sort` or `state`, a `limit` too large"),
    },
)
def compare_jobs(
    session: SessionDep,
    limit: PageSize,
    ids: Annotated[
        str | None, Query(max_length=20000, description="job ids separated by commas, e.g. 3,4,7 (at most 1000)")
    ] = None,
    sweep_id: Annotated[int | None, Query(ge=1, le=DB_INT_MAX, description="the children of this sweep")] = None,
    state: Annotated[JobState | None, Query(description="only jobs in this state")] = None,
    name: Annotated[str | None, Query(max_length=100, description="only jobs whose name contains this")] = None,
    sort: Annotated[
        str, Query(max_length=200, description=f"the column to sort by, `-` before it for descending: {SORT_NAMES}")
    ] = "id",
    offset: Annotated[int, Query(ge=0, le=DB_INT_MAX, description="rows to skip: a page's `next_offset`")] = 0,
    all_fields: Annotated[
        bool, Query(description="true: every spec field as a column; false: only those that differ")
    ] = False,
) -> ComparePage:
    """Compare jobs: every condition given selects (none: every job); one page of rows sorted by `sort`,
    each with the spec fields that differ across the whole selection (or all of them) and its summary
    columns: per block the loss's min, max and final, samples/s, and top-1 where measured."""
    if sweep_id is not None and session.get(Sweep, sweep_id) is None:
        raise ServiceError(404, f"sweep {sweep_id} does not exist; GET /api/v1/sweeps lists the sweeps")
    try:
        selection = Selection(
            ids=parse_ids(ids) if ids is not None else None,
            sweep_id=sweep_id,
            state=state,
            name=name,
        )
        comparison = compare(session, selection, sort=sort, limit=limit, offset=offset, all_fields=all_fields)
    except CompareError as error:
        raise invalid(["query", error.parameter], str(error), error.value) from None
    return page_of(comparison)
