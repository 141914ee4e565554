"""The live event stream of a job (Server-Sent Events), resumable with Last-Event-ID."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from app.api.deps import ReadAccess, SettingsDep, StreamedJobDep
from app.api.schemas import AUTH_ERRORS, EVENT_STREAM, job_errors
from app.api.sse import stream
from app.core.tables import DB_INT_MAX
from app.services.errors import invalid

router = APIRouter(prefix="/jobs/{job_id}/events", tags=["events"], responses=AUTH_ERRORS)


@router.get(
    "",
    dependencies=[ReadAccess],
    response_class=StreamingResponse,
    responses={
        200: EVENT_STREAM,
        **job_errors(invalid="`after` or `Last-Event-ID` is not an event id (an integer from 0 to 2147483647)"),
    },
)
def follow_job(
    job: StreamedJobDep,
    request: Request,
    settings: SettingsDep,
    last_event_id: Annotated[str | None, Header(description="resume after this event id")] = None,
    after: Annotated[
        int | None, Query(ge=0, le=DB_INT_MAX, description="resume after this event id (for clients without headers)")
    ] = None,
) -> StreamingResponse:
    """`text/event-stream` of `state`, `phase`, `metrics` and `log` (a log grew: its phase, rank and size)
    events, keep-alive comments, then `end`."""
    start = after or 0
    if last_event_id:
        if not (last_event_id.isascii() and last_event_id.isdigit() and int(last_event_id) <= DB_INT_MAX):
            message = f"must be an event id sent by this stream: an integer from 0 to {DB_INT_MAX}"
            raise invalid(["header", "last-event-id"], message, last_event_id)
        start = int(last_event_id)
    assert job.id is not None
    body = stream(
        request.app.state.feed,
        settings.database,
        job.id,
        start,
        settings.sse_poll_s,
        settings.sse_keepalive_s,
        request.is_disconnected,
    )
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body, media_type="text/event-stream", headers=headers)
