"""The response shapes of `/api/v1/webhooks` (docs/webhooks.md); the jobs' are app/api/schemas.py, what a client
sends (`WebhookCreate`) app/services/webhook_schemas.py. `WebhookPublic` is a hook with its delivery counts,
`DeliveryPublic` one entry of its delivery log.
"""

from __future__ import annotations

from pydantic import BaseModel, Field, field_serializer

from app.api.schemas import iso
from app.core.json_types import JsonObject
from app.services.webhook_schemas import DeliveryCounts, DeliveryState, Scope


class WebhookPublic(BaseModel):
    """A webhook, without its secret."""

    id: int = Field(description="its id, as in /api/v1/webhooks/{id}")
    url: str = Field(description="where events are POSTed")
    events: list[str] = Field(description="the events it hears")
    scope: Scope = Field(description="whose jobs: server, token, job or sweep")
    job_id: int | None = Field(description="for scope `job`: the job")
    sweep_id: int | None = Field(description="for scope `sweep`: the sweep")
    description: str = Field(description="what it is for")
    created_at: float = Field(description="when it was created (ISO 8601, UTC)")
    deliveries: DeliveryCounts = Field(description="its deliveries by state")

    @field_serializer("created_at")
    def _as_iso(self, value: float) -> str | None:
        return iso(value)


class WebhooksPublic(BaseModel):
    """Every webhook, oldest first."""

    data: list[WebhookPublic] = Field(description="the webhooks")


class DeliveryPublic(BaseModel):
    """One event on its way to one webhook: the delivery log's entry."""

    id: int = Field(description="its id, also sent as X-PipeBD-Delivery")
    webhook_id: int = Field(description="the webhook")
    event: str = Field(description="job.<state>, phase.finished, sweep.finished or sweep.best_changed")
    job_id: int | None = Field(description="the job it is about (for a sweep's event: the job whose end raised it)")
    state: DeliveryState = Field(description="pending (attempts left), succeeded (answered 2xx) or failed")
    attempts: int = Field(description="attempts made so far")
    max_attempts: int = Field(description="attempts it gets in all (PIPEBD_WEBHOOK_MAX_ATTEMPTS)")
    next_attempt_at: float | None = Field(description="while pending: when it is tried next (ISO 8601, UTC)")
    last_status: int | None = Field(description="the receiver's last HTTP status; null: no answer or none yet")
    last_error: str | None = Field(description="why the last attempt failed; null after a success")
    created_at: float = Field(description="when the event happened (ISO 8601, UTC)")
    finished_at: float | None = Field(description="when it succeeded or ran out of attempts (ISO 8601, UTC)")
    payload: JsonObject = Field(description="the body sent (docs/webhooks.md), as stored")

    @field_serializer("next_attempt_at", "created_at", "finished_at")
    def _as_iso(self, value: float | None) -> str | None:
        return iso(value)


class DeliveriesPublic(BaseModel):
    """A page of a webhook's delivery log, newest first."""

    data: list[DeliveryPublic] = Field(description="at most `limit` deliveries")
    next_cursor: str | None = Field(description="pass as `cursor` for the next (older) page; null on the last page")
