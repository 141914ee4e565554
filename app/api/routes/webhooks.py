"""Webhooks: create (the secret write-only), list, read, delete, and each one's delivery log (docs/webhooks.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status
from sqlmodel import Session

from app.api.auth import tenant_of
from app.api.deps import Cursor, PageSize, ReadAccess, SessionDep, SettingsDep, SubmitAccess, WebhookDep
from app.api.routes.jobs import link
from app.api.schemas import AUTH_ERRORS, JSON_BODY_ERRORS, ResponseDoc, problem
from app.api.webhook_schemas import DeliveriesPublic, DeliveryPublic, WebhookPublic, WebhooksPublic
from app.core.tables import Webhook
from app.services.errors import invalid
from app.services.webhook_schemas import DeliveryState, WebhookCreate
from app.services.webhooks import create_webhook, delete_webhook, delivery_counts, list_deliveries, list_webhooks

router = APIRouter(prefix="/webhooks", tags=["webhooks"], responses=AUTH_ERRORS)
HOOK = "/api/v1/webhooks/{webhook_id}"
CREATED_LINKS = {  # what a client can do with the webhook it just created
    "read": link(HOOK, "get", "webhook_id"),
    "deliveries": link(f"{HOOK}/deliveries", "get", "webhook_id"),
    "delete": link(HOOK, "delete", "webhook_id"),
}
NOT_FOUND: ResponseDoc = {404: problem("no webhook has this id (it may have been deleted)")}
HOOK_ERRORS: ResponseDoc = {
    **NOT_FOUND,
    422: problem("the webhook id is not a positive integer in range"),
}


def public(session: Session, hooks: list[Webhook]) -> list[WebhookPublic]:
    counts = delivery_counts(session, [hook.id for hook in hooks if hook.id is not None])
    return [
        WebhookPublic(**hook.model_dump(exclude={"secret", "tenant"}), deliveries=counts[hook.id])
        for hook in hooks
        if hook.id is not None
    ]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=WebhookPublic,
    dependencies=[SubmitAccess],
    responses={
        201: {"description": "the webhook (without its secret)", "links": CREATED_LINKS},
        **JSON_BODY_ERRORS,
        422: problem(
            "a bad field (each named): not an http(s) address, an unknown event, scope `job` without an existing"
            " job, scope `token` on a server without tokens"
        ),
    },
)
def add_webhook(
    body: WebhookCreate, request: Request, response: Response, session: SessionDep, settings: SettingsDep
) -> WebhookPublic:
    """Send the chosen events of every job, of this token's jobs, or of one job to `url`, signed with `secret`."""
    hook = create_webhook(session, request=body, tenant=tenant_of(request, settings))
    response.headers["Location"] = str(request.url_for("read_webhook", webhook_id=hook.id).path)
    return public(session, [hook])[0]


@router.get("", response_model=WebhooksPublic, dependencies=[ReadAccess])
def read_webhooks(session: SessionDep) -> WebhooksPublic:
    """Every webhook, oldest first, with its deliveries by state (never a secret)."""
    return WebhooksPublic(data=public(session, list_webhooks(session)))


@router.get("/{webhook_id}", response_model=WebhookPublic, dependencies=[ReadAccess], responses=HOOK_ERRORS)
def read_webhook(hook: WebhookDep, session: SessionDep) -> WebhookPublic:
    """One webhook with its deliveries by state."""
    return public(session, [hook])[0]


@router.delete(
    "/{webhook_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    dependencies=[SubmitAccess],
    responses=HOOK_ERRORS,
)
def remove_webhook(hook: WebhookDep, session: SessionDep) -> Response:
    """Delete a webhook and its delivery log; its pending deliveries are not sent."""
    delete_webhook(session, hook=hook)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get(
    "/{webhook_id}/deliveries",
    response_model=DeliveriesPublic,
    dependencies=[ReadAccess],
    responses={**NOT_FOUND, 422: problem("a bad webhook id, an unknown `state`, a `limit` too large, a bad `cursor`")},
)
def read_deliveries(
    hook: WebhookDep,
    session: SessionDep,
    settings: SettingsDep,
    limit: PageSize,
    state: Annotated[DeliveryState | None, Query(description="only deliveries in this state")] = None,
    cursor: Cursor = None,
) -> DeliveriesPublic:
    """The webhook's delivery log, newest first: each event's state, attempts, last status and error, next try."""
    assert hook.id is not None
    try:
        rows, next_cursor = list_deliveries(session, hook_id=hook.id, state=state, limit=limit, cursor=cursor)
    except ValueError as error:
        raise invalid(["query", "cursor"], str(error)) from None
    data = [DeliveryPublic(**row.model_dump(), max_attempts=settings.webhook_max_attempts) for row in rows]
    return DeliveriesPublic(data=data, next_cursor=next_cursor)
