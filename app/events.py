"""Server-Sent Events for one job: state and phase changes, metric batches and log growth, then `end`.

Every event carries its database id as the SSE `id`, so a client that reconnects with
`Last-Event-ID` gets exactly the events it missed. Comment lines keep idle connections alive, and an
`end` event (without id) says the job has finished and nothing more will come.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
from sqlmodel import col, select

from app.core.database import session_scope
from app.core.lifecycle import FINAL
from app.core.tables import Job, JobEvent, JobMetric

BATCH = 200  # events read per query
RETRY_MS = 2000  # how soon EventSource clients reconnect after a dropped connection


@dataclass
class Poll:
    events: list[dict[str, Any]]  # {"id", "event", "data"}
    state: str | None  # None: the job no longer exists
    termination_reason: str | None


def expand(event: JobEvent, session: Any) -> dict[str, Any]:
    """The payload a client sees; a metrics event carries the telemetry lines of its batch."""
    data = dict(event.data)
    if event.kind == "metrics":
        rows = session.exec(
            select(JobMetric)
            .where(JobMetric.job_id == event.job_id, col(JobMetric.id).between(data["first_id"], data["last_id"]))
            .order_by(col(JobMetric.id))
        ).all()
        data = {key: value for key, value in data.items() if key not in ("first_id", "last_id")}
        data["records"] = [row.record for row in rows]
    return {"id": event.id, "event": event.kind, "data": {"job_id": event.job_id, "time": event.time, **data}}


def poll(database: str, job_id: int, after: int) -> Poll:
    """The job's state, then its events after id `after` (state first: a final state's event is then seen)."""
    with session_scope(database) as session:
        job = session.get(Job, job_id)
        if job is None:
            return Poll([], None, None)
        state, reason = job.state, job.termination_reason
        query = select(JobEvent).where(JobEvent.job_id == job_id, col(JobEvent.id) > after)
        rows = session.exec(query.order_by(col(JobEvent.id)).limit(BATCH)).all()
        return Poll([expand(row, session) for row in rows], state, reason)


def format_event(event_id: int | None, name: str, data: dict[str, Any]) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


async def stream(
    database: str,
    job_id: int,
    after: int,
    poll_s: float,
    keepalive_s: float,
    disconnected: Callable[[], Awaitable[bool]],
) -> AsyncIterator[str]:
    """The SSE body: replay after `after`, follow until the job is final and drained, then `end`."""
    yield f"retry: {RETRY_MS}\n\n"
    last_sent = time.monotonic()
    while not await disconnected():
        result = await anyio.to_thread.run_sync(poll, database, job_id, after)
        for event in result.events:
            yield format_event(event["id"], event["event"], event["data"])
            after = event["id"]
            last_sent = time.monotonic()
        if len(result.events) == BATCH:
            continue
        if result.state is None or result.state in FINAL:
            yield format_event(
                None,
                "end",
                {"job_id": job_id, "state": result.state or "deleted", "termination_reason": result.termination_reason},
            )
            return
        if time.monotonic() - last_sent >= keepalive_s:
            yield ": keep-alive\n\n"
            last_sent = time.monotonic()
        await anyio.sleep(poll_s)
