"""FastAPI dependencies: the app's settings, a database session per request, the job named in the
path (an id within the database's integer range, else 422 before any query), and the two
authorization levels."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Path, Request
from sqlmodel import Session

from app.auth import require
from app.core.database import get_engine
from app.core.settings import Settings
from app.core.tables import DB_INT_MAX, Job
from app.problems import ApiError


def get_app_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_session(request: Request) -> Iterator[Session]:
    with Session(get_engine(request.app.state.settings.database), expire_on_commit=False) as session:
        yield session


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
ReadAccess = Depends(require("read"))
SubmitAccess = Depends(require("submit"))


JobId = Annotated[int, Path(ge=1, le=DB_INT_MAX, description="the job's id (1, 2, ...)")]


def get_job(job_id: JobId, session: SessionDep) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise ApiError(404, f"job {job_id} does not exist (it may have been deleted)")
    return job


def get_job_briefly(job_id: JobId, request: Request) -> Job:
    """The job, read in a session closed at once: for an event stream, which outlives its request's
    dependencies (a session held for a stream's life would take a pooled connection with it)."""
    with Session(get_engine(request.app.state.settings.database), expire_on_commit=False) as session:
        return get_job(job_id, session)


JobDep = Annotated[Job, Depends(get_job)]
StreamedJobDep = Annotated[Job, Depends(get_job_briefly)]
