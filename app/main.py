"""The FastAPI application factory.

`create_app(settings)` migrates the database, connects the Celery producer, mounts the API under
`/api/v1`, `/healthz`, `/metrics`, the schema and its documentation (`/openapi.json`, `/docs`,
`/redoc`: behind the tokens, see app/web/docs.py; built by app/api/openapi.py) and the dashboard
seam, answers every error as a problem body (app/api/problems.py: also the request ids, the catch-all 500
and the body-size limit), and runs the lost-job reaper and the webhook delivery loop (app/core/deliveries.py)
in the background while the app serves.
Submissions are counted per client in the database (app/api/limits.py) and their specs checked in helper processes
(app/services/preflight.py), so this process never imports torch.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import AsyncIterator

import anyio
from celery import Celery
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from app import web
from app.api import openapi, problems
from app.api.monitoring import JobCollector
from app.api.routes import artifacts, compare, events, health, jobs, logs, metrics, models, quota, sweeps, webhooks
from app.api.schemas import SERVER_ERROR
from app.api.sse import Feed
from app.core.database import migrate
from app.core.deliveries import run_deliveries
from app.core.priority import rewake_stranded
from app.core.queue import enqueue, make_celery
from app.core.quotas import release_budgets
from app.core.reaper import reap_lost_jobs, reap_stale_seats
from app.core.settings import Settings, get_settings
from app.services.preflight import shared_pool
from app.web import docs

API_PREFIX = "/api/v1"
log = logging.getLogger("pipebd.api")


def run_reaper(settings: Settings, celery: Celery, stop: threading.Event) -> None:
    def publish(job_id: int, queue: str) -> None:
        enqueue(celery, job_id, queue)

    woken: dict[int, float] = {}
    while not stop.wait(settings.reaper_interval_s):
        try:
            for job_id in reap_lost_jobs(
                settings.database, settings.stale_after_s, publish, settings.max_restarts, settings.host_id
            ):
                log.warning("job %s: its worker was lost", job_id)
            for job_id in reap_stale_seats(settings.database, settings.gang_bound_s + settings.stale_after_s):
                log.warning("job %s: gang seats no worker gave up were dropped", job_id)
            for job_id in release_budgets(settings.database, publish):
                log.info("job %s: its tenant's device-hour budget frees again; published", job_id)
            for job_id in rewake_stranded(
                settings.database, publish, settings.rewake_after_s, settings.stale_after_s, woken
            ):
                log.warning("job %s: queued beside a worker with room (its broker message lost?); published", job_id)
        except Exception:  # keep reaping after a database hiccup
            log.exception("the lost-job reaper failed; retrying")


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    stop = threading.Event()
    reaper = threading.Thread(target=run_reaper, args=(settings, app.state.celery, stop), name="reaper", daemon=True)
    sender = threading.Thread(target=run_deliveries, args=(settings, stop), name="webhooks", daemon=True)
    for thread in (reaper, sender):
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in (reaper, sender):
            thread.join(timeout=5)


def create_app(settings: Settings | None = None, *, run_migrations: bool = True) -> FastAPI:
    settings = settings or get_settings()
    settings.prepare_folders()
    if run_migrations:
        migrate(settings.database)
    app = FastAPI(
        title="PipeBD",
        summary="Pipelined blockwise knowledge distillation jobs: submit, follow, cancel, download.",
        version="0.1.0",
        lifespan=lifespan,
        # FastAPI's own schema and docs routes answer anyone; app/web/docs.py serves them behind the tokens
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.celery = make_celery(settings)
    app.state.registry = CollectorRegistry(auto_describe=False)
    app.state.registry.register(JobCollector(settings.database))
    app.state.feed = Feed(ttl_s=settings.sse_poll_s / 2)
    app.state.preflight = shared_pool(settings.spec_checkers, settings.spec_checker_idle_s)
    app.state.preflight_threads = anyio.CapacityLimiter(settings.spec_checkers)
    routers = (
        jobs.router,
        sweeps.router,
        compare.router,
        metrics.router,
        logs.router,
        artifacts.router,
        events.router,
        webhooks.router,
        quota.router,
        models.router,
        models.choose_router,
    )
    for router in routers:
        app.include_router(router, prefix=API_PREFIX, responses=SERVER_ERROR)
    app.include_router(health.router, responses=SERVER_ERROR)
    app.include_router(docs.schema_router)
    app.include_router(docs.pages_router)
    web.install(app)
    problems.install(app, settings.max_body_bytes)
    openapi.install(app, settings)
    return app
