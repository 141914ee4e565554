"""What the dashboard pages read: recent telemetry per rank, the last event id, state history,
the engine's lifecycle events, the plan and summary files, and the history of a NAS job's architecture
probabilities."""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path
from typing import Any

from sqlmodel import Session, col, func, select

from app.artifacts import file_path
from app.models import Job, JobEvent, JobMetric

RECENT_TASKS = 40  # telemetry lines per rank behind the bottleneck analysis and the compare table
ENGINE_EVENTS = 200  # lifecycle lines of events.jsonl shown on a job page, newest kept


def recent_records(session: Session, job: Job, per_rank: int = RECENT_TASKS) -> dict[int, list[dict[str, Any]]]:
    """The newest `per_rank` telemetry lines of each rank, oldest first (one indexed query per rank)."""
    result: dict[int, list[dict[str, Any]]] = {}
    for rank in range(job.nproc):
        query = (
            select(JobMetric.record)
            .where(JobMetric.job_id == job.id, JobMetric.rank == rank)
            .order_by(col(JobMetric.seq).desc())
            .limit(per_rank)
        )
        rows = [dict(record) for record in session.exec(query).all()]
        if rows:
            result[rank] = rows[::-1]
    return result


def last_event_id(session: Session, job_id: int) -> int:
    """The job's newest event id: a page rendered now follows the event stream from there."""
    value = session.exec(select(func.max(JobEvent.id)).where(JobEvent.job_id == job_id)).one()
    return int(value or 0)


def state_history(session: Session, job_id: int) -> list[JobEvent]:
    query = select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == "state").order_by(col(JobEvent.id))
    return list(session.exec(query).all())


def read_json_artifact(job: Job, name: str) -> dict[str, Any] | None:
    path = file_path(job, name)
    if path is None:
        return None
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def engine_events(job: Job, limit: int = ENGINE_EVENTS) -> list[dict[str, Any]]:
    """The newest lines of the run's events.jsonl (prepared, launched, rank_started, checkpoint, ...)."""
    if job.run_dir is None:
        return []
    path = Path(job.run_dir) / "events.jsonl"
    if not path.is_file():
        return []
    with path.open(encoding="utf-8", errors="replace") as handle:
        lines = deque(handle, maxlen=limit)
    events = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line still being written
        if isinstance(event, dict):
            events.append(event)
    return events


def architecture_history(session: Session, job: Job) -> dict[int, list[tuple[int, list[list[float]]]]]:
    """NAS jobs: per block, (step, probabilities of each layer's candidates) at every architecture update,
    oldest first. Only the architecture rounds' lines are read (their `arch`); an update reported by
    several ranks (replicas) is taken once, from the lowest rank."""
    record = col(JobMetric.record)
    query = (
        select(JobMetric.step, record["arch"])
        .where(JobMetric.job_id == job.id, record["round"].as_string() == "arch")
        .order_by(col(JobMetric.step), col(JobMetric.rank))
    )
    found: dict[int, dict[int, list[list[float]]]] = {}
    for step, arch in session.exec(query).all():
        for block, layers in (arch or {}).items():
            found.setdefault(int(block), {}).setdefault(int(step), layers)
    return {block: sorted(updates.items()) for block, updates in sorted(found.items())}
