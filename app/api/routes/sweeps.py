"""Sweeps: create one (a base spec and a grid, list or random search), list them, read one with its
children, and pause, resume or cancel every child at once (app/services/sweeps.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status
from sqlmodel import Session

from app.api.deps import ReadAccess, SessionDep, SettingsDep, SubmitAccess, SweepDep, submitter_of
from app.api.routes.jobs import link
from app.api.schemas import (
    AUTH_ERRORS,
    JSON_BODY_ERRORS,
    ResponseDoc,
    SweepBest,
    SweepChild,
    SweepDetail,
    SweepProgress,
    SweepPublic,
    SweepsPublic,
    job_fields,
    problem,
)
from app.core.database import get_engine
from app.core.objectives import Objective
from app.core.tables import Sweep
from app.services.errors import ServiceError, invalid
from app.services.search import SweepRequest
from app.services.sweeps import (
    SweepView,
    cancel_sweep,
    list_sweeps,
    pause_sweep,
    resume_sweep,
    submit_sweep,
    sweep_view,
)

router = APIRouter(prefix="/sweeps", tags=["sweeps"], responses=AUTH_ERRORS)
SWEEP = "/api/v1/sweeps/{sweep_id}"
CREATED_LINKS = {  # what a client can do with the sweep it just created
    "read": link(SWEEP, "get", "sweep_id"),
    **{action: link(f"{SWEEP}/{action}", "post", "sweep_id") for action in ("pause", "resume", "cancel")},
}
SWEEP_ERRORS: ResponseDoc = {
    404: problem("no sweep has this id"),
    422: problem("a path parameter is not valid"),
}


def public_of(view: SweepView) -> SweepPublic:
    """A sweep's list entry: what its detail has too."""
    sweep = view.sweep
    assert sweep.id is not None
    return SweepPublic(
        id=sweep.id,
        name=sweep.name,
        created_at=sweep.created_at,
        search=sweep.search,
        max_parallel=sweep.max_parallel,
        objective=None if sweep.objective is None else Objective.model_validate(sweep.objective),
        state=view.state,
        progress=SweepProgress(**vars(view.progress)),
        best=SweepBest(job_id=view.best.job_id, value=view.best.value) if view.best else None,
    )


def detail_of(view: SweepView) -> SweepDetail:
    jobs = [
        SweepChild(
            **job_fields(job),
            overrides=job.sweep_overrides or {},
            objective_value=view.values.get(job.id) if job.id is not None else None,
        )
        for job in view.children
    ]
    return SweepDetail(**dict(public_of(view)), spec=view.sweep.spec, jobs=jobs)


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=SweepDetail,
    dependencies=[SubmitAccess],
    responses={
        202: {"description": "the sweep, its children queued", "links": CREATED_LINKS},
        **JSON_BODY_ERRORS,
        422: problem(
            "a bad search (not exactly one of grid, list and random; a field that is not a dotted path) or a child"
            " that is not a valid spec: each problem names the override (`grid.train.lr`, `list.2.train.lr`,"
            " `random.fields.train.lr`) or the base spec's field (`spec.train.epochs`); nothing was stored"
        ),
        429: problem("too many submissions, or the children would pass the queue's bound: see Retry-After"),
        503: problem("the broker did not accept a child, or no spec checker could start; nothing was stored"),
    },
)
async def create_sweep(body: SweepRequest, request: Request, response: Response) -> SweepDetail:
    """Create a sweep: every child is checked as a whole spec first, and all are queued or none."""
    sweep = await submit_sweep(submitter_of(request), body)
    response.headers["Location"] = str(request.url_for("read_sweep", sweep_id=sweep.id).path)
    with Session(get_engine(request.app.state.settings.database)) as session:
        stored = session.get(Sweep, sweep.id)
        assert stored is not None
        return detail_of(sweep_view(session, stored))


@router.get(
    "",
    response_model=SweepsPublic,
    dependencies=[ReadAccess],
    responses={422: problem("a `limit` too large")},
)
def read_sweeps(
    session: SessionDep,
    settings: SettingsDep,
    limit: Annotated[int, Query(ge=1, description="sweeps to list (at most PIPEBD_PAGE_LIMIT_MAX)")] = 50,
) -> SweepsPublic:
    """Sweeps, newest first, with their state, progress and best child."""
    if limit > settings.page_limit_max:
        raise invalid(["query", "limit"], f"at most {settings.page_limit_max} sweeps per request", limit)
    return SweepsPublic(data=[public_of(sweep_view(session, sweep)) for sweep in list_sweeps(session, limit)])


@router.get("/{sweep_id}", response_model=SweepDetail, dependencies=[ReadAccess], responses=SWEEP_ERRORS)
def read_sweep(sweep: SweepDep, session: SessionDep) -> SweepDetail:
    """State, progress, objective and best child, and every child with its overrides and objective value."""
    return detail_of(sweep_view(session, sweep))


@router.post("/{sweep_id}/pause", response_model=SweepDetail, dependencies=[SubmitAccess], responses=SWEEP_ERRORS)
def pause(sweep: SweepDep, session: SessionDep) -> SweepDetail:
    """Pause every queued or launched child (queued ones at once, launched ones at their next step);
    ended children stay as they are."""
    pause_sweep(session, sweep_view(session, sweep).children)
    return detail_of(sweep_view(session, sweep))


@router.post(
    "/{sweep_id}/resume",
    response_model=SweepDetail,
    dependencies=[SubmitAccess],
    responses={
        **SWEEP_ERRORS,
        409: problem("no child resumed: none is failed, cancelled or paused, or none could (the detail says why)"),
        503: problem("the broker did not accept a child: the children before it were resumed; retry"),
    },
)
def resume(request: Request, sweep: SweepDep, session: SessionDep, settings: SettingsDep) -> SweepDetail:
    """Put every failed, cancelled or paused child back in the queue, each to continue from its checkpoints."""
    resumed, problems = resume_sweep(session, settings, request.app.state.celery, sweep_view(session, sweep).children)
    if not resumed:
        why = "; ".join(problems) or "no child is failed, cancelled or paused"
        raise ServiceError(status.HTTP_409_CONFLICT, f"no child of sweep {sweep.id} resumed: {why}")
    return detail_of(sweep_view(session, sweep))


@router.post("/{sweep_id}/cancel", response_model=SweepDetail, dependencies=[SubmitAccess], responses=SWEEP_ERRORS)
def cancel(sweep: SweepDep, session: SessionDep) -> SweepDetail:
    """Cancel every child: queued and paused ones end at once, launched ones are stopped by their workers.
    Idempotent."""
    cancel_sweep(session, sweep_view(session, sweep).children)
    return detail_of(sweep_view(session, sweep))
