"""What a client sends to create a webhook, and a hook's delivery counts: the shapes app/services/webhooks.py
takes and gives (the API's answers are app/api/webhook_schemas.py).

`WebhookCreate` is what a client sends: refused fields get a 422 naming each one. The `secret` is
write-only: no answer ever shows it.
"""

from __future__ import annotations

from typing import Literal, Self
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.core.states import STATES
from app.core.tables import DB_INT_MAX
from app.core.webhooks import JOB, SWEEP, event_names

EVENTS = event_names(STATES)  # what a hook may choose: job.<state> for every state, phase.finished, sweep.*
Scope = Literal["server", "token", "job", "sweep"]  # app.core.webhooks.SCOPES
SCOPE_IDS = {JOB: "job_id", SWEEP: "sweep_id"}  # the scopes that name what they hear, and the field naming it
DeliveryState = Literal["pending", "succeeded", "failed"]  # app.core.webhooks.DELIVERY_STATES


class WebhookCreate(BaseModel):
    """A new webhook: where to send which events about whose jobs, and the secret that signs them."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        max_length=2000,
        description="where each event is POSTed: an http:// or https:// address (a Slack incoming webhook works)",
        json_schema_extra={"format": "uri"},
    )
    events: list[str] = Field(
        min_length=1,
        max_length=len(EVENTS),
        description="the events it hears: job.<state> (a job moved to that state), phase.finished,"
        " sweep.finished (every job of a sweep ended) and sweep.best_changed (a sweep's best job changed)",
        json_schema_extra={"items": {"type": "string", "enum": list(EVENTS)}, "uniqueItems": True},
    )
    scope: Scope = Field(
        "server",
        description="whose jobs: `server` every job and sweep, `token` those submitted with this request's token,"
        " `job` the job `job_id`, `sweep` the sweep `sweep_id` and its jobs",
    )
    job_id: int | None = Field(None, ge=1, le=DB_INT_MAX, description="for scope `job`: the job (absent otherwise)")
    sweep_id: int | None = Field(
        None, ge=1, le=DB_INT_MAX, description="for scope `sweep`: the sweep (absent otherwise)"
    )
    secret: str = Field(
        min_length=16,
        max_length=200,
        description="keys the X-PipeBD-Signature HMAC of every body; write-only: never shown again",
        json_schema_extra={"writeOnly": True},
    )
    description: str = Field("", max_length=200, description="what it is for, as the dashboard shows it")

    @field_validator("url")
    @classmethod
    def _web_address(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in value):
            raise ValueError("an http:// or https:// address with a host, e.g. https://hooks.example.com/pipebd")
        return value

    @field_validator("events")
    @classmethod
    def _known_events(cls, value: list[str]) -> list[str]:
        unknown = [event for event in value if event not in EVENTS]
        if unknown:
            raise ValueError(f"unknown event {unknown[0]!r}; the events are {', '.join(EVENTS)}")
        if len(set(value)) < len(value):
            raise ValueError("an event is listed twice; list each once")
        return value

    @model_validator(mode="after")
    def _id_for_its_scope(self) -> Self:
        for scope, name in SCOPE_IDS.items():
            given = getattr(self, name) is not None
            if self.scope == scope and not given:
                raise ValueError(f"scope `{scope}` needs `{name}`: the {scope} whose events the hook hears")
            if self.scope != scope and given:
                raise ValueError(
                    f"`{name}` is for scope `{scope}`; remove it, or set scope to `{scope}` (got {self.scope!r})"
                )
        return self


class DeliveryCounts(BaseModel):
    """A hook's deliveries by state."""

    pending: int = Field(description="not yet answered 2xx, with attempts left")
    succeeded: int = Field(description="answered 2xx")
    failed: int = Field(description="every attempt failed")
