"""The live event stream of a job (Server-Sent Events), resumable with Last-Event-ID."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Query, Request
from fastapi.responses import StreamingResponse

from app.api.schemas import AUTH_ERRORS, job_errors
from app.deps import JobDep, ReadAccess, SettingsDep
from app.events import stream

router = APIRouter(prefix="/jobs/{job_id}/events", tags=["events"], responses=AUTH_ERRORS)


@router.get(
    "",
    dependencies=[ReadAccess],
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "Server-Sent Events: `state`, `phase`, `metrics` and `log` events with ids, keep-alive"
            " comments, then `end` once the job has finished",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        **job_errors(invalid="`Last-Event-ID` is not an event id of this stream"),
    },
)
def follow_job(
    job: JobDep,
    request: Request,
    settings: SettingsDep,
    last_event_id: Annotated[str | None, Header(description="resume after this event id")] = None,
    after: Annotated[
        int | None, Query(ge=0, description="resume after this event id (for clients without headers)")
    ] = None,
) -> StreamingResponse:
    """`text/event-stream` of `state`, `phase`, `metrics` and `log` (a log grew: its phase, rank and size)
    events, keep-alive comments, then `end`."""
    start = after or 0
    if last_event_id:
        if not last_event_id.isdigit():
            raise HTTPException(
                422, f"Last-Event-ID: must be an event id (an integer) sent by this stream, got {last_event_id!r}"
            )
        start = int(last_event_id)
    assert job.id is not None
    body = stream(
        settings.database, job.id, start, settings.sse_poll_s, settings.sse_keepalive_s, request.is_disconnected
    )
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body, media_type="text/event-stream", headers=headers)
