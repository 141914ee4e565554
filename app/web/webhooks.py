"""The webhooks pages: every hook with its deliveries by state (`/webhooks`), and one hook's delivery log
(`/webhooks/{id}`: each event's state, attempts, last status and error, next attempt), newest first.

Hooks are created and deleted through the API (`/api/v1/webhooks`, docs/webhooks.md); these pages show
what was sent and what failed, never a secret.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import HTMLResponse

from app.api.deps import SessionDep, SettingsDep
from app.core.tables import DB_INT_MAX, Webhook
from app.services.webhooks import delivery_counts, list_deliveries, list_webhooks
from app.web.access import ViewerDep
from app.web.routing import PageError, PageRoute
from app.web.templating import render

PAGE_SIZE = 50  # deliveries per page of a hook's log

router = APIRouter(route_class=PageRoute)


@router.get("/webhooks", response_class=HTMLResponse)
def webhooks_page(request: Request, viewer: ViewerDep, session: SessionDep) -> HTMLResponse:
    hooks = list_webhooks(session)
    counts = delivery_counts(session, [hook.id for hook in hooks if hook.id is not None])
    return render(request, "webhooks/list.html", {"hooks": hooks, "counts": counts})


@router.get("/webhooks/{webhook_id}", response_class=HTMLResponse)
def webhook_page(
    request: Request,
    viewer: ViewerDep,
    session: SessionDep,
    settings: SettingsDep,
    webhook_id: Annotated[int, Path(ge=1, le=DB_INT_MAX)],
    cursor: Annotated[str | None, Query(max_length=64)] = None,
) -> HTMLResponse:
    hook = session.get(Webhook, webhook_id)
    if hook is None:
        raise PageError(404, "No such webhook", f"Webhook {webhook_id} does not exist; it may have been deleted.")
    try:
        rows, next_cursor = list_deliveries(session, hook_id=webhook_id, state=None, limit=PAGE_SIZE, cursor=cursor)
    except ValueError as error:
        raise PageError(422, "Not a page of this log", f"{error}.") from None
    context = {
        "hook": hook,
        "counts": delivery_counts(session, [webhook_id])[webhook_id],
        "deliveries": rows,
        "next_cursor": next_cursor,
        "cursor": cursor,
        "max_attempts": settings.webhook_max_attempts,
    }
    return render(request, "webhooks/detail.html", context)
