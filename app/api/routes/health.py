"""Health and Prometheus metrics, outside /api/v1: `GET /healthz` and `GET /metrics`."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.api.deps import ReadAccess, SettingsDep
from app.api.monitoring import check_broker, check_database
from app.api.schemas import AUTH_ERRORS, Health, problem
from app.services.errors import ServiceError

router = APIRouter(tags=["operations"])


@router.get(
    "/healthz",
    response_model=Health,
    responses={503: problem("the database or the broker does not answer; the detail says which, and why")},
)
def health(request: Request, settings: SettingsDep) -> Health:
    """200 when the database and the broker answer; 503 naming the one that does not."""
    checks = {"database": check_database(settings.database), "broker": check_broker(request.app.state.celery)}
    failing = [f"the {name} is {state}" for name, state in checks.items() if state != "ok"]
    if failing:
        raise ServiceError(503, "; ".join(failing) + "; jobs cannot be submitted or started until it answers")
    return Health(status="ok", database="ok", broker="ok")


@router.get(
    "/metrics",
    dependencies=[ReadAccess],
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus text exposition format",
            "content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}},
        },
        **AUTH_ERRORS,
    },
)
def prometheus_metrics(request: Request) -> Response:
    """Prometheus text format: jobs by state, queue depth, worker heartbeats, samples/s of running jobs."""
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)
