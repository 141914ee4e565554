"""Webhooks as the API and the dashboard manage them: create (checked against the server and the database),
list, delete, and read a hook's delivery log. Events reach hooks through app/core/webhooks.py; the
sending is app/core/deliveries.py's.
"""

from __future__ import annotations

from collections import Counter

from sqlalchemy import delete
from sqlmodel import Session, col, func, select

from app.core.tables import Job, Sweep, Webhook, WebhookDelivery
from app.core.webhooks import DELIVERY_STATES, JOB, SWEEP, TOKEN
from app.services.errors import invalid
from app.services.jobs import decode_cursor, encode_cursor
from app.services.webhook_schemas import DeliveryCounts, WebhookCreate

CURSOR_KIND = "delivery"


def create_webhook(session: Session, *, request: WebhookCreate, tenant: str | None) -> Webhook:
    """Store a hook; a 422 problem when its scope cannot be honoured (no token to scope by, no such job).
    `tenant` is the creating request's (the API's app/api/auth.py:tenant_of): a `token` hook hears its jobs."""
    if request.scope == TOKEN and tenant is None:
        raise invalid(
            ["body", "scope"],
            "scope `token` hears the jobs of the token that creates the hook, and this server has no tokens"
            " (PIPEBD_API_TOKENS): use scope `server`",
            request.scope,
        )
    if request.scope == JOB and session.get(Job, request.job_id) is None:
        raise invalid(["body", "job_id"], f"job {request.job_id} does not exist (it may have been deleted)")
    if request.scope == SWEEP and session.get(Sweep, request.sweep_id) is None:
        raise invalid(["body", "sweep_id"], f"sweep {request.sweep_id} does not exist (GET /api/v1/sweeps lists them)")
    hook = Webhook(
        url=request.url,
        events=request.events,
        scope=request.scope,
        job_id=request.job_id,
        sweep_id=request.sweep_id,
        tenant=tenant if request.scope == TOKEN else None,
        secret=request.secret,
        description=request.description,
    )
    session.add(hook)
    session.commit()
    session.refresh(hook)
    return hook


def list_webhooks(session: Session) -> list[Webhook]:
    return list(session.exec(select(Webhook).order_by(col(Webhook.id))).all())


def delivery_counts(session: Session, hook_ids: list[int]) -> dict[int, DeliveryCounts]:
    """Each hook's deliveries by state."""
    query = (
        select(WebhookDelivery.webhook_id, WebhookDelivery.state, func.count())
        .where(col(WebhookDelivery.webhook_id).in_(hook_ids))
        .group_by(col(WebhookDelivery.webhook_id), col(WebhookDelivery.state))
    )
    counts: dict[int, Counter[str]] = {hook_id: Counter() for hook_id in hook_ids}
    for hook_id, state, count in session.exec(query).all():
        counts[hook_id][state] = count
    return {hook_id: DeliveryCounts(**{s: found[s] for s in DELIVERY_STATES}) for hook_id, found in counts.items()}


def delete_webhook(session: Session, *, hook: Webhook) -> None:
    """Remove a hook and its delivery log (pending deliveries are not sent)."""
    session.execute(delete(WebhookDelivery).where(col(WebhookDelivery.webhook_id) == hook.id))
    session.delete(hook)
    session.commit()


def list_deliveries(
    session: Session, *, hook_id: int, state: str | None, limit: int, cursor: str | None
) -> tuple[list[WebhookDelivery], str | None]:
    """A hook's deliveries, newest first, `limit` at a time (ValueError for a cursor this API did not give)."""
    query = (
        select(WebhookDelivery)
        .where(col(WebhookDelivery.webhook_id) == hook_id)
        .order_by(col(WebhookDelivery.id).desc())
        .limit(limit + 1)
    )
    if state is not None:
        query = query.where(col(WebhookDelivery.state) == state)
    if cursor is not None:
        query = query.where(col(WebhookDelivery.id) < decode_cursor(cursor, CURSOR_KIND))
    rows = list(session.exec(query).all())
    more, rows = len(rows) > limit, rows[:limit]
    last = rows[-1].id if more and rows else None
    return rows, (None if last is None else encode_cursor(last, CURSOR_KIND))
