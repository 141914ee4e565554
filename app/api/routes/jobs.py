"""Jobs: submit (JSON or YAML, idempotent with a key), list (cursor pages), read, change priority, cancel, pause,
resume, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response, status
from sqlmodel import Session

from app.api.deps import Cursor, JobDep, PageSize, ReadAccess, SessionDep, SettingsDep, SubmitAccess, submitter_of
from app.api.schemas import (
    AUTH_ERRORS,
    AttemptPublic,
    GangSeatPublic,
    JobChange,
    JobDetail,
    JobPublic,
    JobsPublic,
    job_errors,
    job_fields,
    problem,
)
from app.core import gangs
from app.core.attempts import attempts_of, shape_notes
from app.core.database import get_engine
from app.core.json_types import JsonObject
from app.core.lifecycle import request_cancel, restart_budget
from app.core.settings import Settings
from app.core.states import JobState
from app.core.tables import Job
from app.services.errors import ServiceError, invalid
from app.services.jobs import ConflictError, change_priority, delete_job, list_jobs, queue_position, waiting_reason
from app.services.resume import pause_job, resume_job
from app.services.submissions import submit

router = APIRouter(prefix="/jobs", tags=["jobs"], responses=AUTH_ERRORS)

SPEC_BODY: JsonObject = {  # an OpenAPI operation fragment
    "requestBody": {
        "required": True,
        "description": "A PipeBD job spec (every field: docs/spec.md), as JSON or as YAML: the same document"
        " either way. It must name its workload; everything else has a default.",
        "content": {
            media_type: {"schema": {"$ref": "#/components/schemas/Spec"}}
            for media_type in ("application/json", "application/yaml")
        },
    }
}


def link(path: str, method: str, parameter: str = "job_id") -> JsonObject:
    """An OpenAPI link from a created resource (a job, a sweep: its `parameter`, a webhook) to one operation on it."""
    pointer = path.replace("~", "~0").replace("/", "~1")
    return {"operationRef": f"#/paths/{pointer}/{method}", "parameters": {parameter: "$response.body#/id"}}


JOB = "/api/v1/jobs/{job_id}"
CREATED_LINKS = {  # what a client can do with the job it just created (its plan and logs come once it runs)
    "read": link(JOB, "get"),
    "cancel": link(f"{JOB}/cancel", "post"),
    "pause": link(f"{JOB}/pause", "post"),
    "resume": link(f"{JOB}/resume", "post"),
    "delete": link(JOB, "delete"),
    "follow": link(f"{JOB}/events", "get"),
    "metrics": link(f"{JOB}/metrics", "get"),
    "artifacts": link(f"{JOB}/artifacts", "get"),
}


def detail_of(session: Session, settings: Settings, job: Job) -> JobDetail:
    """The job as GET /jobs/{id} answers it: with its attempts, restart budget and, when queued, its wait."""
    assert job.id is not None
    stored = attempts_of(session, job.id)
    attempts = [
        AttemptPublic(**attempt.model_dump(), note=note)
        for attempt, note in zip(stored, shape_notes(stored), strict=True)
    ]
    return JobDetail(
        **{**job_fields(job), "phases": job.phases or [], "max_restarts": restart_budget(job, settings.max_restarts)},
        attempts=attempts,
        gang=[GangSeatPublic(**seat.model_dump()) for seat in gangs.seats(session, job.id)],
        waiting_reason=waiting_reason(session, job=job, stale_after_s=settings.stale_after_s),
        queue_position=queue_position(session, job=job),
    )


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobDetail,
    dependencies=[SubmitAccess],
    openapi_extra=SPEC_BODY,
    responses={
        202: {"description": "the job, queued (or the one the same Idempotency-Key created)", "links": CREATED_LINKS},
        400: problem("the body is not a JSON or YAML document (malformed, not an object, too many values)"),
        413: problem("the body is larger than PIPEBD_MAX_BODY_BYTES"),
        415: problem("a Content-Type other than JSON or YAML"),
        422: problem(
            "bad spec fields (one item per field, with its `loc`), a spec refused by the server's bounds, data"
            " roots or factory allowlist or by the engine's preflight, a check past PIPEBD_SPEC_CHECK_TIMEOUT_S,"
            " or an Idempotency-Key already used for another spec"
        ),
        429: problem("too many submissions from this token or address, or too many queued jobs: see Retry-After"),
        503: problem("the broker did not accept the job, or no spec checker could start; nothing was stored"),
    },
)
async def submit_job(
    request: Request,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> JobDetail:
    """Queue a job. 422 names each bad field; the same Idempotency-Key and spec give back the same job."""
    content_type = request.headers.get("content-type", "")
    created = await submit(submitter_of(request), request.body, content_type, idempotency_key)
    response.headers["Location"] = str(request.url_for("read_job", job_id=created.job.id).path)
    if created.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    with Session(get_engine(request.app.state.settings.database)) as session:
        return detail_of(session, request.app.state.settings, created.job)


@router.get(
    "",
    response_model=JobsPublic,
    dependencies=[ReadAccess],
    responses={422: problem("an unknown `state`, a `limit` too large, a bad `cursor`")},
)
def read_jobs(
    session: SessionDep,
    limit: PageSize,
    state: Annotated[JobState | None, Query(description="only jobs in this state")] = None,
    cursor: Cursor = None,
) -> JobsPublic:
    """Jobs, newest first, one page at a time."""
    try:
        jobs, next_cursor = list_jobs(session, state=state, limit=limit, cursor=cursor)
    except ValueError as error:
        raise invalid(["query", "cursor"], str(error)) from None
    return JobsPublic(data=[JobPublic(**job_fields(job)) for job in jobs], next_cursor=next_cursor)


@router.get("/{job_id}", response_model=JobDetail, dependencies=[ReadAccess], responses=job_errors())
def read_job(job: JobDep, session: SessionDep, settings: SettingsDep) -> JobDetail:
    """State, timestamps, progress, plan summary, termination reason, error text and attempts."""
    return detail_of(session, settings, job)


@router.post("/{job_id}/cancel", response_model=JobDetail, dependencies=[SubmitAccess], responses=job_errors())
def cancel_job(job: JobDep, session: SessionDep, settings: SettingsDep) -> JobDetail:
    """Cancel: a queued or paused job ends at once; a running one is stopped by its worker. Idempotent."""
    assert job.id is not None
    request_cancel(session, job.id)
    session.commit()
    session.refresh(job)
    return detail_of(session, settings, job)


@router.patch(
    "/{job_id}",
    response_model=JobDetail,
    dependencies=[SubmitAccess],
    responses=job_errors(
        conflict="the job has started or succeeded: only a queued, paused, failed or cancelled job takes a new priority"
    ),
)
def change_job(change: JobChange, job: JobDep, session: SessionDep, settings: SettingsDep) -> JobDetail:
    """Change a job's priority: a queued job moves in the queue at once; a paused, failed or cancelled one
    waits at its new priority once resumed."""
    try:
        change_priority(session, job=job, priority=change.priority)
    except ConflictError as error:
        raise ServiceError(status.HTTP_409_CONFLICT, str(error)) from None
    session.refresh(job)
    return detail_of(session, settings, job)


@router.post(
    "/{job_id}/pause",
    response_model=JobDetail,
    dependencies=[SubmitAccess],
    responses=job_errors(conflict="the job has ended or is being cancelled: only queued or running jobs pause"),
)
def pause(job: JobDep, session: SessionDep, settings: SettingsDep) -> JobDetail:
    """Pause: a queued job leaves the queue; a running one saves every block at its next step and stops
    (`pausing`, then `paused`). Idempotent; resume continues it."""
    try:
        pause_job(session, job)
    except ConflictError as error:
        raise ServiceError(status.HTTP_409_CONFLICT, str(error)) from None
    session.refresh(job)
    return detail_of(session, settings, job)


@router.post(
    "/{job_id}/resume",
    response_model=JobDetail,
    dependencies=[SubmitAccess],
    responses={
        **job_errors(
            conflict="the job cannot resume: it is not failed, cancelled or paused, its run directory is gone,"
            " or its spec no longer validates (the detail says which); nothing was changed"
        ),
        503: problem("the broker did not accept the job; nothing was changed"),
    },
)
def resume(request: Request, job: JobDep, session: SessionDep, settings: SettingsDep) -> JobDetail:
    """Put a failed, cancelled or paused job back in the queue; it continues in its run directory, every
    block from its last checkpoint."""
    try:
        resume_job(session, settings, request.app.state.celery, job)
    except ConflictError as error:
        raise ServiceError(status.HTTP_409_CONFLICT, str(error)) from None
    session.refresh(job)
    return detail_of(session, settings, job)


@router.delete(
    "/{job_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    dependencies=[SubmitAccess],
    responses=job_errors(conflict="the job has not finished: cancel it and wait for it to end"),
)
def remove_job(job: JobDep, session: SessionDep) -> Response:
    """Delete a finished job with its metrics, events and files; 409 while it is not finished."""
    try:
        delete_job(session, job=job)
    except ConflictError as error:
        raise ServiceError(status.HTTP_409_CONFLICT, str(error)) from None
    return Response(status_code=status.HTTP_204_NO_CONTENT)
