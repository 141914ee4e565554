"""Health and Prometheus metrics, outside /api/v1: `GET /healthz` and `GET /metrics`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.deps import ReadAccess, SettingsDep
from app.monitoring import check_broker, check_database

router = APIRouter(tags=["operations"])


@router.get("/healthz")
def health(request: Request, settings: SettingsDep) -> Any:
    """200 when the database and the broker answer; 503 naming the one that does not."""
    checks = {"database": check_database(settings.database), "broker": check_broker(request.app.state.celery)}
    healthy = all(value == "ok" for value in checks.values())
    return JSONResponse({"status": "ok" if healthy else "unavailable", **checks}, status_code=200 if healthy else 503)


@router.get("/metrics", dependencies=[ReadAccess])
def prometheus_metrics(request: Request) -> Response:
    """Prometheus text format: jobs by state, queue depth, worker heartbeats, samples/s of running jobs."""
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)
