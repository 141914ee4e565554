"""Server-Sent Events for one job: state and phase changes, metric batches and log growth, then `end`.

Every event carries its database id as the SSE `id`, so a client that reconnects with
`Last-Event-ID` gets exactly the events it missed. Comment lines keep idle connections alive, and an
`end` event (without id) says the job has finished and nothing more will come.

Followers share their queries (`Feed`): all the clients of one job that wait after the same event id
get one database read (with its events already formatted) per `ttl_s`, in a few threads of their own,
so a hundred dashboards on one job cost about what one does, and never take the threads that the
other routes answer from.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypedDict

import anyio
from sqlmodel import Session, col, select

from app.core.database import session_scope
from app.core.json_types import JsonObject
from app.core.states import AT_REST
from app.core.tables import Job, JobEvent, JobMetric

BATCH = 200  # events read per query
RETRY_MS = 2000  # how soon EventSource clients reconnect after a dropped connection


FEED_THREADS = 4  # database reads of event streams at once, at most


class StreamEvent(TypedDict):
    """One event as a follower gets it: its id (the SSE id), its kind (the SSE event name) and its data."""

    id: int
    event: str
    data: JsonObject  # the event's data as the worker stored it, with its job and time (and a metrics batch's lines)


@dataclass
class Poll:
    events: list[tuple[int, str]]  # (id, the event as sent)
    state: str | None  # None: the job no longer exists
    termination_reason: str | None


def expand(event: JobEvent, session: Session) -> StreamEvent:
    """The payload a client sees; a metrics event carries the telemetry lines of its batch."""
    assert event.id is not None  # read from the database
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
        events = [expand(row, session) for row in rows]
        return Poll([(e["id"], format_event(e["id"], e["event"], e["data"])) for e in events], state, reason)


def format_event(event_id: int | None, name: str, data: JsonObject) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


class Feed:
    """Shared reads: one query per (database, job, event id) and `ttl_s`, however many followers wait there."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self.threads = anyio.CapacityLimiter(FEED_THREADS)
        self.recent: dict[tuple[str, int, int], tuple[float, Poll]] = {}
        self.locks: dict[tuple[str, int, int], anyio.Lock] = {}

    def _fresh(self, key: tuple[str, int, int]) -> Poll | None:
        entry = self.recent.get(key)
        return entry[1] if entry is not None and entry[0] > time.monotonic() else None

    async def poll(self, database: str, job_id: int, after: int) -> Poll:
        key = (database, job_id, after)
        lock = self.locks.setdefault(key, anyio.Lock())
        async with lock:  # the first follower reads; those who came meanwhile take its answer
            result = self._fresh(key)
            if result is None:
                result = await anyio.to_thread.run_sync(poll, database, job_id, after, limiter=self.threads)
                self.recent[key] = (time.monotonic() + self.ttl_s, result)
        self._forget_old()
        return result

    def _forget_old(self) -> None:
        now = time.monotonic()
        for key in [key for key, (expires, _) in self.recent.items() if expires <= now]:
            del self.recent[key]
        for key in [key for key, lock in self.locks.items() if key not in self.recent and not lock.locked()]:
            del self.locks[key]


async def stream(
    feed: Feed,
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
        result = await feed.poll(database, job_id, after)
        for event_id, text in result.events:
            yield text
            after = event_id
            last_sent = time.monotonic()
        if len(result.events) == BATCH:
            continue
        if result.state is None or result.state in AT_REST:
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
