"""Health and Prometheus metrics, outside /api/v1: `GET /healthz` and `GET /metrics`."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.api.schemas import AUTH_ERRORS, Health
from app.deps import ReadAccess, SettingsDep
from app.monitoring import check_broker, check_database

router = APIRouter(tags=["operations"])


@router.get(
    "/healthz",
    response_model=Health,
    responses={503: {"model": Health, "description": "the database or the broker does not answer; it says which"}},
)
def health(request: Request, response: Response, settings: SettingsDep) -> Health:
    """200 when the database and the broker answer; 503 naming the one that does not."""
    database, broker = check_database(settings.database), check_broker(request.app.state.celery)
    healthy = database == broker == "ok"
    response.status_code = 200 if healthy else 503
    return Health(status="ok" if healthy else "unavailable", database=database, broker=broker)


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
