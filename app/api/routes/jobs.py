"""Jobs: submit (JSON or YAML, idempotent with a key), list (cursor pages), read, cancel, delete."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from sqlmodel import Session

from app.api.schemas import AUTH_ERRORS, ErrorMessage, InvalidRequest, JobDetail, JobPublic, JobsPublic, job_errors
from app.core.database import get_engine
from app.core.lifecycle import STATES, request_cancel
from app.core.queue import enqueue
from app.core.tables import Job
from app.deps import JobDep, ReadAccess, SessionDep, SettingsDep, SubmitAccess
from app.jobs import ConflictError, Created, create_job, delete_job, discard_job, list_jobs, waiting_reason
from app.specs import BodyError, parse_body, spec_hash, validate_document
from pipebd_core.spec import SpecError

router = APIRouter(prefix="/jobs", tags=["jobs"], responses=AUTH_ERRORS)

SPEC_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "A PipeBD job spec (see the README's spec section), as JSON or as YAML.",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "application/yaml": {"schema": {"type": "string"}},
        },
    }
}


def detail_of(job: Job, reason: str | None = None) -> JobDetail:
    return JobDetail(**{**job.model_dump(), "phases": job.phases or []}, waiting_reason=reason)


def spec_error_detail(error: SpecError) -> list[dict[str, Any]]:
    """`field.path: reason` lines as FastAPI-style error items with a `loc` path."""
    items = []
    for line in str(error).splitlines():
        path, sep, _ = line.partition(": ")
        loc = path.split(".") if sep and " " not in path else []
        items.append({"loc": ["body", *loc], "msg": line, "type": "spec_error"})
    return items


def _store_and_enqueue(request: Request, document: dict[str, Any], key: str | None) -> Created:
    settings, celery = request.app.state.settings, request.app.state.celery
    try:
        spec = validate_document(document, settings)
    except SpecError as error:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, spec_error_detail(error)) from None
    with Session(get_engine(settings.database), expire_on_commit=False) as session:
        try:
            created = create_job(session, spec=spec, request_hash=spec_hash(spec), idempotency_key=key)
        except ConflictError as error:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(error)) from None
        if created.replayed:
            return created
        assert created.job.id is not None
        try:
            enqueue(celery, created.job.id, created.job.queue)
        except Exception as error:
            discard_job(session, job_id=created.job.id)
            detail = f"the broker did not accept the job ({type(error).__name__}: {error}); nothing was stored, retry"
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, detail) from None
        return created


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobDetail,
    dependencies=[SubmitAccess],
    openapi_extra=SPEC_BODY,
    responses={
        400: {"model": ErrorMessage, "description": "the body is not a JSON or YAML document"},
        415: {"model": ErrorMessage, "description": "a Content-Type other than JSON or YAML"},
        422: {
            "model": InvalidRequest,
            "description": "bad spec fields (one item per field, with its `loc`), a spec refused by the server's"
            " data roots or factory allowlist, or an Idempotency-Key already used for another spec",
        },
        503: {"model": ErrorMessage, "description": "the broker did not accept the job; nothing was stored"},
    },
)
async def submit_job(
    request: Request,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> JobDetail:
    """Queue a job. 422 names each bad field; the same Idempotency-Key and spec give back the same job."""
    try:
        document = parse_body(await request.body(), request.headers.get("content-type", ""))
    except BodyError as error:
        raise HTTPException(error.status, str(error)) from None
    created = await run_in_threadpool(_store_and_enqueue, request, document, idempotency_key)
    response.headers["Location"] = str(request.url_for("read_job", job_id=created.job.id).path)
    if created.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return detail_of(created.job)


@router.get(
    "",
    response_model=JobsPublic,
    dependencies=[ReadAccess],
    responses={
        422: {"model": InvalidRequest, "description": "an unknown `state`, a `limit` too large, a bad `cursor`"}
    },
)
def read_jobs(
    session: SessionDep,
    settings: SettingsDep,
    state: Annotated[str | None, Query(description="only jobs in this state")] = None,
    limit: Annotated[int, Query(ge=1, description="page size")] = 50,
    cursor: Annotated[str | None, Query(description="next_cursor of the previous page")] = None,
) -> JobsPublic:
    """Jobs, newest first, one page at a time."""
    if state is not None and state not in STATES:
        raise HTTPException(422, f"state: {state!r} is not a job state; use one of {', '.join(STATES)}")
    if limit > settings.page_limit_max:
        raise HTTPException(
            422, f"limit: at most {settings.page_limit_max} jobs per page, got {limit}; follow next_cursor"
        )
    try:
        jobs, next_cursor = list_jobs(session, state=state, limit=limit, cursor=cursor)
    except ValueError as error:
        raise HTTPException(422, str(error)) from None
    return JobsPublic(data=[JobPublic(**job.model_dump()) for job in jobs], next_cursor=next_cursor)


@router.get("/{job_id}", response_model=JobDetail, dependencies=[ReadAccess], responses=job_errors())
def read_job(job: JobDep, session: SessionDep, settings: SettingsDep) -> JobDetail:
    """State, timestamps, progress, plan summary, termination reason and error text."""
    return detail_of(job, waiting_reason(session, job=job, stale_after_s=settings.stale_after_s))


@router.post("/{job_id}/cancel", response_model=JobDetail, dependencies=[SubmitAccess], responses=job_errors())
def cancel_job(job: JobDep, session: SessionDep) -> JobDetail:
    """Cancel: a queued job ends at once; a running one is stopped by its worker. Idempotent."""
    assert job.id is not None
    request_cancel(session, job.id)
    session.commit()
    session.refresh(job)
    return detail_of(job)


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
        raise HTTPException(status.HTTP_409_CONFLICT, str(error)) from None
    return Response(status_code=status.HTTP_204_NO_CONTENT)
