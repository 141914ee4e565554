"""Admitting a submission (`POST /api/v1/jobs`), cheapest refusal first, never blocking the event loop.

1. the client's rate (app/limits.py): 429 with Retry-After;
2. the body, already bounded by app/problems.py's BodyLimit (413);
3. parsing and validating the spec (app/specs.py) in a worker thread;
4. an Idempotency-Key seen before: the original job back, nothing checked again;
5. the queue's capacity: 429 with Retry-After while `max_queued_jobs` jobs are queued;
6. the engine's preflight in a helper process (app/preflight.py);
7. storing the queued job and publishing it to the broker; a job the broker refused is removed again.

Steps 3 and 6 share one time bound, `spec_check_timeout_s`: past it the spec is refused (422) and a
helper still building its workload is killed.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
from fastapi import Request
from sqlmodel import Session

from app.core.database import get_engine
from app.core.queue import enqueue
from app.core.settings import Settings
from app.jobs import ConflictError, Created, create_job, discard_job, queued_count, replayed
from app.limits import client_key, retry_after
from app.preflight import CheckerCrashed, CheckerUnavailable, CheckTimeout
from app.problems import ApiError
from app.specs import parse_body, preflight_problems, spec_hash, validate_document
from pipebd_core.spec import Spec

QUEUE_RETRY_S = 30  # Retry-After of a submission refused because the queue is full


def admit_rate(request: Request, settings: Settings) -> None:
    wait_s = request.app.state.limiter.admit(client_key(request, bool(settings.tokens)))
    if wait_s is not None:
        who = "token" if settings.tokens else "client address"
        raise ApiError(
            429,
            f"more than {settings.submissions_per_minute} submissions in a minute from this {who}"
            f" (PIPEBD_SUBMISSIONS_PER_MINUTE); retry in {retry_after(wait_s)} s",
            headers={"Retry-After": retry_after(wait_s)},
        )


def too_slow(settings: Settings) -> ApiError:
    return ApiError(
        422,
        f"checking the spec took longer than {settings.spec_check_timeout_s:g} s (PIPEBD_SPEC_CHECK_TIMEOUT_S):"
        " its workload or data set is too large or too slow to build; make it smaller (image_size, the factory's"
        " options) or ask the operator for a longer bound",
    )


def read_spec(body: bytes, content_type: str, settings: Settings) -> Spec:
    return validate_document(parse_body(body, content_type), settings)


def check_capacity(settings: Settings) -> None:
    with Session(get_engine(settings.database)) as session:
        queued = queued_count(session)
    if queued >= settings.max_queued_jobs:
        raise ApiError(
            429,
            f"{queued} jobs are queued, this server's limit (PIPEBD_MAX_QUEUED_JOBS={settings.max_queued_jobs});"
            f" retry once some have started, or cancel queued ones",
            headers={"Retry-After": str(QUEUE_RETRY_S)},
        )


def find_replay(settings: Settings, key: str | None, request_hash: str) -> Created | None:
    if key is None:
        return None
    with Session(get_engine(settings.database), expire_on_commit=False) as session:
        try:
            job = replayed(session, key, request_hash)
        except ConflictError as error:
            raise ApiError(422, str(error)) from None
    return Created(job, replayed=True) if job is not None else None


def preflight(request: Request, spec: Spec, timeout_s: float) -> None:
    settings: Settings = request.app.state.settings
    try:
        problem = request.app.state.preflight.check(spec.model_dump(mode="json"), timeout_s)
    except CheckTimeout:
        raise too_slow(settings) from None
    except CheckerCrashed as crash:
        raise ApiError(
            422,
            f"building the spec's workload or data set ended the spec checker process (exit code {crash.code}):"
            " it is probably too large to build on this server; make it smaller",
        ) from None
    except CheckerUnavailable as error:
        raise ApiError(503, f"the spec checker could not start ({error}); nothing was stored, retry") from None
    if problem is not None:
        problems = preflight_problems(problem)
        raise ApiError(422, problem.splitlines()[0], problems)


def store_and_enqueue(request: Request, spec: Spec, request_hash: str, key: str | None) -> Created:
    settings, celery = request.app.state.settings, request.app.state.celery
    with Session(get_engine(settings.database), expire_on_commit=False) as session:
        try:
            created = create_job(session, spec=spec, request_hash=request_hash, idempotency_key=key)
        except ConflictError as error:
            raise ApiError(422, str(error)) from None
        if created.replayed:
            return created
        assert created.job.id is not None
        try:
            enqueue(celery, created.job.id, created.job.queue)
        except Exception as error:
            discard_job(session, job_id=created.job.id)
            detail = f"the broker did not accept the job ({type(error).__name__}: {error}); nothing was stored, retry"
            raise ApiError(503, detail) from None
        return created


async def in_thread(deadline: float, settings: Settings, function: Any, *args: Any) -> Any:
    """`function(*args)` in a worker thread, given up (422) at `deadline` (the thread finishes on its own)."""
    try:
        with anyio.fail_after(max(0.0, deadline - time.monotonic())):
            return await anyio.to_thread.run_sync(function, *args, abandon_on_cancel=True)
    except TimeoutError:
        raise too_slow(settings) from None


async def submit(request: Request, key: str | None) -> Created:
    """Steps 1 to 7; raises ApiError with the status and problems of the first step that refuses."""
    settings: Settings = request.app.state.settings
    admit_rate(request, settings)
    body = await request.body()
    deadline = time.monotonic() + settings.spec_check_timeout_s
    spec: Spec = await in_thread(deadline, settings, read_spec, body, request.headers.get("content-type", ""), settings)
    request_hash = spec_hash(spec)
    replay = await anyio.to_thread.run_sync(find_replay, settings, key, request_hash)
    if replay is not None:
        return replay
    await anyio.to_thread.run_sync(check_capacity, settings)
    remaining = max(0.1, deadline - time.monotonic())
    await anyio.to_thread.run_sync(preflight, request, spec, remaining, limiter=request.app.state.preflight_threads)
    created: Created = await anyio.to_thread.run_sync(store_and_enqueue, request, spec, request_hash, key)
    return created
