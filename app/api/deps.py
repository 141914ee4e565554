"""FastAPI dependencies: the app's settings, a database session per request, the job, sweep or webhook
named in the path (an id within the database's integer range, else 422 before any query), a list's page
size and cursor, and the two authorization levels."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, TypeVar

from fastapi import Depends, Path, Query, Request
from sqlmodel import Session, SQLModel

from app.api.auth import require, tenant_of
from app.api.limits import client_key
from app.core.database import get_engine
from app.core.settings import Settings
from app.core.tables import DB_INT_MAX, Job, Sweep, Webhook
from app.services.errors import ServiceError, invalid
from app.services.jobs import CURSOR_MAX
from app.services.submissions import Submitter


def get_app_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_session(request: Request) -> Iterator[Session]:
    with Session(get_engine(request.app.state.settings.database), expire_on_commit=False) as session:
        yield session


def submitter_of(request: Request) -> Submitter:
    """Who submits by this request, and the server's checker and broker, for app/services/submissions.py."""
    settings: Settings = request.app.state.settings
    return Submitter(
        settings=settings,
        celery=request.app.state.celery,
        checker=request.app.state.preflight,
        checker_threads=request.app.state.preflight_threads,
        client=client_key(request, bool(settings.tokens)),
        tenant=tenant_of(request, settings),
    )


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
SessionDep = Annotated[Session, Depends(get_session)]


def page_size(
    settings: SettingsDep,
    limit: Annotated[int, Query(ge=1, description="page size (at most PIPEBD_PAGE_LIMIT_MAX, 200 by default)")] = 50,
) -> int:
    """A list request's `limit`: 422 past PIPEBD_PAGE_LIMIT_MAX."""
    if limit > settings.page_limit_max:
        raise invalid(["query", "limit"], f"at most {settings.page_limit_max} per page; follow next_cursor", limit)
    return limit


PageSize = Annotated[int, Depends(page_size)]
Cursor = Annotated[str | None, Query(max_length=CURSOR_MAX, description="next_cursor of the previous page")]
ReadAccess = Depends(require("read"))
SubmitAccess = Depends(require("submit"))


JobId = Annotated[int, Path(ge=1, le=DB_INT_MAX, description="the job's id (1, 2, ...)")]
Row = TypeVar("Row", bound=SQLModel)


def stored_row(session: Session, table: type[Row], row_id: int, what: str) -> Row:
    """The row `row_id` of `table`, else a 404 naming `what` (job, webhook)."""
    row = session.get(table, row_id)
    if row is None:
        raise ServiceError(404, f"{what} {row_id} does not exist (it may have been deleted)")
    return row


def get_job(job_id: JobId, session: SessionDep) -> Job:
    return stored_row(session, Job, job_id, "job")


def get_job_briefly(job_id: JobId, request: Request) -> Job:
    """The job, read in a session closed at once: for an event stream, which outlives its request's
    dependencies (a session held for a stream's life would take a pooled connection with it)."""
    with Session(get_engine(request.app.state.settings.database), expire_on_commit=False) as session:
        return get_job(job_id, session)


JobDep = Annotated[Job, Depends(get_job)]
StreamedJobDep = Annotated[Job, Depends(get_job_briefly)]


SweepId = Annotated[int, Path(ge=1, le=DB_INT_MAX, description="the sweep's id (1, 2, ...)")]


def get_sweep(sweep_id: SweepId, session: SessionDep) -> Sweep:
    sweep = session.get(Sweep, sweep_id)
    if sweep is None:
        raise ServiceError(404, f"sweep {sweep_id} does not exist")
    return sweep


SweepDep = Annotated[Sweep, Depends(get_sweep)]
WebhookId = Annotated[int, Path(ge=1, le=DB_INT_MAX, description="the webhook's id (1, 2, ...)")]


def get_webhook(webhook_id: WebhookId, session: SessionDep) -> Webhook:
    return stored_row(session, Webhook, webhook_id, "webhook")


WebhookDep = Annotated[Webhook, Depends(get_webhook)]
