"""Admitting a submission (`POST /api/v1/jobs`), cheapest refusal first, never blocking the event loop.

1. the client's rate (counted in the database, app/core/limits.py): 429 with Retry-After;
2. the body, already bounded by app/api/problems.py's BodyLimit (413);
3. parsing and validating the spec (app/services/specs.py) in a worker thread;
4. an Idempotency-Key seen before: the original job back, nothing checked again;
5. the queue's capacity: 429 with Retry-After while `max_queued_jobs` jobs are queued (a cheap early look),
   and the token's device-hour budget (app/core/quotas.py): 429 while it is spent;
6. the engine's preflight in a helper process (app/services/preflight.py);
7. storing the queued job, the queue's capacity checked again in the same transaction under the queue's
   lock (app/core/limits.py: no two API processes both take the last place), and publishing it to the
   broker; a job the broker refused is removed again.

Steps 3 and 6 share one time bound, `spec_check_timeout_s`: past it the spec is refused (422) and a
helper still building its workload is killed.

Nothing here reads a request: the API resolves who submits (`Submitter`: the client whose rate is counted,
the tenant, the server's checker and broker) and the body, and turns a `ServiceError` into its answer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio
from celery import Celery
from sqlmodel import Session

from app.core.database import get_engine
from app.core.json_types import JsonObject
from app.core.limits import count_submission, retry_after
from app.core.queue import enqueue
from app.core.quotas import budget_spent, budget_use
from app.core.settings import Settings
from app.core.tables import TenantQuota
from app.services.errors import ServiceError, field_problem, summary
from app.services.jobs import ConflictError, Created, QueueFull, create_job, discard_jobs, queued_count, replayed
from app.services.models import ModelRefused, names_a_model, resolve_models
from app.services.preflight import CheckerCrashed, CheckerUnavailable, CheckTimeout
from app.services.specs import parse_body, preflight_problems, spec_hash, validate_document
from pipebd_core.spec import Spec

QUEUE_RETRY_S = 30  # Retry-After of a submission refused because the queue is full


class SpecChecker(Protocol):
    """The engine's preflight in helper processes (app/services/preflight.py:Pool)."""

    def check(self, document: JsonObject, timeout_s: float) -> str | None: ...


@dataclass(frozen=True)
class Submitter:
    """Who submits, and what of the server a submission uses: resolved by the API from its request."""

    settings: Settings
    celery: Celery
    checker: SpecChecker  # the engine's preflight
    checker_threads: anyio.CapacityLimiter  # the threads that wait on the checker, at most one per checker
    client: str  # whose submission rate is counted (app/api/limits.py:client_key)
    tenant: str | None  # who submits (app/api/auth.py:tenant_of); None when the server has no tokens


def admit_rate(settings: Settings, client: str) -> None:
    wait_s = count_submission(settings.database, client, settings.submissions_per_minute)
    if wait_s is not None:
        who = "token" if settings.tokens else "client address"
        raise ServiceError(
            429,
            f"more than {settings.submissions_per_minute} submissions in a minute from this {who}"
            f" (PIPEBD_SUBMISSIONS_PER_MINUTE); retry in {retry_after(wait_s)} s",
            headers={"Retry-After": retry_after(wait_s)},
        )


def too_slow(settings: Settings) -> ServiceError:
    return ServiceError(
        422,
        f"checking the spec took longer than {settings.spec_check_timeout_s:g} s (PIPEBD_SPEC_CHECK_TIMEOUT_S):"
        " its workload or data set is too large or too slow to build; make it smaller (image_size, the factory's"
        " options) or ask the operator for a longer bound",
    )


def read_spec(body: bytes, content_type: str, settings: Settings) -> Spec:
    document, allowed = resolve_references(parse_body(body, content_type), settings)
    return validate_document(document, settings, allowed)


def resolve_references(document: JsonObject, settings: Settings) -> tuple[JsonObject, list[Path]]:
    """A registered model the spec names (`workload.teacher: {model: N}`) replaced by its files (app/services/
    models.py), before the spec is validated; 422 naming the field for an unknown or unusable model."""
    if not names_a_model(document):
        return document, []
    with Session(get_engine(settings.database)) as session:
        try:
            return resolve_models(session, document)
        except ModelRefused as refused:
            problems = [field_problem(["body", *refused.loc], refused.message, refused.value)]
            raise ServiceError(422, summary(problems), problems) from None


def queue_full(queued: int, settings: Settings, adding: int = 1) -> ServiceError:
    more = "" if adding == 1 else f" and this sweep would add {adding}"
    return ServiceError(
        429,
        f"{queued} jobs are queued{more}, this server's limit (PIPEBD_MAX_QUEUED_JOBS={settings.max_queued_jobs});"
        f" retry once some have started, or cancel queued ones",
        headers={"Retry-After": str(QUEUE_RETRY_S)},
    )


def over_budget(quota: TenantQuota, hours: float, wait_s: float | None) -> ServiceError:
    """429 for a tenant whose device-hour budget is spent (app/core/quotas.py)."""
    when = "once its running jobs end and the window rolls past them" if wait_s is None else f"in {wait_s:.0f} s"
    retry = str(QUEUE_RETRY_S if wait_s is None else max(1, math.ceil(wait_s)))
    return ServiceError(
        429,
        f"{budget_spent(quota, hours)}: its device_hours quota is spent; submissions are accepted again {when},"
        " or sooner if the operator raises the budget (`pipebd quotas set`)",
        headers={"Retry-After": retry},
    )


def check_capacity(settings: Settings, tenant: str | None, adding: int = 1) -> None:
    """The early look (step 5) at the queue's capacity and the tenant's device-hour budget: spares a full queue
    the preflight; step 7 decides the queue's. `adding`: the queued jobs this submission would add (a sweep's
    children). The budget is taken by the claims (app/core/quotas.py), so this look is its only check here."""
    with Session(get_engine(settings.database)) as session:
        queued = queued_count(session)
        quota = None if tenant is None else session.get(TenantQuota, tenant)
        hours, wait_s = (0.0, 0.0) if quota is None else budget_use(session, quota, time.time())
    if queued + adding > settings.max_queued_jobs:
        raise queue_full(queued, settings, adding)
    if quota is not None and wait_s != 0.0:
        raise over_budget(quota, hours, wait_s)


def find_replay(settings: Settings, key: str | None, request_hash: str) -> Created | None:
    if key is None:
        return None
    with Session(get_engine(settings.database), expire_on_commit=False) as session:
        try:
            job = replayed(session, key, request_hash)
        except ConflictError as error:
            raise ServiceError(422, str(error)) from None
    return Created(job, replayed=True) if job is not None else None


def preflight(submitter: Submitter, spec: Spec, timeout_s: float) -> None:
    settings = submitter.settings
    try:
        problem = submitter.checker.check(spec.model_dump(mode="json"), timeout_s)
    except CheckTimeout:
        raise too_slow(settings) from None
    except CheckerCrashed as crash:
        raise ServiceError(
            422,
            f"building the spec's workload or data set ended the spec checker process (exit code {crash.code}):"
            " it is probably too large to build on this server; make it smaller",
        ) from None
    except CheckerUnavailable as error:
        raise ServiceError(503, f"the spec checker could not start ({error}); nothing was stored, retry") from None
    if problem is not None:
        problems = preflight_problems(problem)
        raise ServiceError(422, problem.splitlines()[0], problems)


def store_and_enqueue(submitter: Submitter, spec: Spec, request_hash: str, key: str | None) -> Created:
    settings, celery = submitter.settings, submitter.celery
    with Session(get_engine(settings.database), expire_on_commit=False) as session:
        try:
            created = create_job(
                session,
                spec=spec,
                request_hash=request_hash,
                idempotency_key=key,
                max_queued=settings.max_queued_jobs,
                tenant=submitter.tenant,
            )
        except ConflictError as error:
            raise ServiceError(422, str(error)) from None
        except QueueFull as full:
            raise queue_full(full.queued, settings) from None
        if created.replayed:
            return created
        assert created.job.id is not None
        try:
            enqueue(celery, created.job.id, created.job.queue)
        except Exception as error:
            discard_jobs(session, job_ids=[created.job.id])
            session.commit()
            detail = f"the broker did not accept the job ({type(error).__name__}: {error}); nothing was stored, retry"
            raise ServiceError(503, detail) from None
        return created


async def in_thread(deadline: float, settings: Settings, function: Any, *args: Any) -> Any:
    """`function(*args)` in a worker thread, given up (422) at `deadline` (the thread finishes on its own)."""
    try:
        with anyio.fail_after(max(0.0, deadline - time.monotonic())):
            return await anyio.to_thread.run_sync(function, *args, abandon_on_cancel=True)
    except TimeoutError:
        raise too_slow(settings) from None


async def submit(
    submitter: Submitter, read_body: Callable[[], Awaitable[bytes]], content_type: str, key: str | None
) -> Created:
    """Steps 1 to 7; raises ServiceError with the status and problems of the first step that refuses.
    `read_body` is awaited once the rate admits the submission (the body is not read before)."""
    settings = submitter.settings
    await anyio.to_thread.run_sync(admit_rate, settings, submitter.client)
    body = await read_body()
    deadline = time.monotonic() + settings.spec_check_timeout_s
    spec: Spec = await in_thread(deadline, settings, read_spec, body, content_type, settings)
    request_hash = spec_hash(spec)
    replay = await anyio.to_thread.run_sync(find_replay, settings, key, request_hash)
    if replay is not None:
        return replay
    await anyio.to_thread.run_sync(check_capacity, settings, submitter.tenant)
    remaining = max(0.1, deadline - time.monotonic())
    await anyio.to_thread.run_sync(preflight, submitter, spec, remaining, limiter=submitter.checker_threads)
    created: Created = await anyio.to_thread.run_sync(store_and_enqueue, submitter, spec, request_hash, key)
    return created
