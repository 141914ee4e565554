"""What the dashboard pages read: recent telemetry per rank, the last event id, state history,
the engine's lifecycle events, the plan and summary files, and the history of a NAS job's architecture
probabilities."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from sqlmodel import Session, col, func, select

from app.core import figures
from app.core.json_types import JsonObject
from app.core.tables import Job, JobEvent, JobMetric
from app.services.artifacts import file_path
from pipebd_core.documents.architecture import Architecture
from pipebd_core.documents.base import Document, DocumentError
from pipebd_core.documents.calibration import Calibration
from pipebd_core.documents.choice import ChoiceRecord
from pipebd_core.documents.phases import DISTILL
from pipebd_core.documents.telemetry import DistillLine
from pipebd_core.rundir import RunDir

D = TypeVar("D", bound=Document)

ENGINE_EVENTS = 200  # lifecycle lines of events.jsonl shown on a job page, newest kept


def recent_lines(session: Session, job: Job) -> dict[int, list[DistillLine]]:
    """The distillation lines every figure is computed over (app/core/figures.py): each rank's newest, oldest first."""
    assert job.id is not None
    found = figures.recent_lines(session, job.id, job.world_size, DISTILL)
    return {rank: [line for line in lines if isinstance(line, DistillLine)] for rank, lines in found.items()}


def last_event_id(session: Session, job_id: int) -> int:
    """The job's newest event id: a page rendered now follows the event stream from there."""
    value = session.exec(select(func.max(JobEvent.id)).where(JobEvent.job_id == job_id)).one()
    return int(value or 0)


def state_history(session: Session, job_id: int) -> list[JobEvent]:
    query = select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == "state").order_by(col(JobEvent.id))
    return list(session.exec(query).all())


def read_json_artifact(job: Job, name: str) -> JsonObject | None:
    path = file_path(job, name)
    if path is None:
        return None
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def read_calibration(job: Job) -> Calibration | None:
    """What training measured against the profile (calibration.json); None before it calibrated, or for
    a calibration an earlier PipeBD wrote (this one cannot read it: the page shows none)."""
    value = read_json_artifact(job, "calibration.json")
    try:
        return Calibration.from_json(value) if value is not None else None
    except DocumentError:
        return None


def read_document(job: Job, name: str, kind: type[D]) -> D | None:
    """Artifact `name` as the document `kind`, None while the job has not written it (or it is not JSON);
    DocumentError when another version of PipeBD wrote it."""
    data = read_json_artifact(job, name)
    return None if data is None else kind.from_json(data)


def read_choices(job: Job) -> list[tuple[ChoiceRecord, Architecture]]:
    """A search's choices made again (choices/<n>/), in order: each one whose choice.json is written (the last
    file a choice writes) and readable, with its architecture.json."""
    if job.run_dir is None:
        return []
    run_dir = RunDir(Path(job.run_dir))
    found = []
    indices = sorted(int(path.name) for path in run_dir.choices.glob("*") if path.name.isdigit())
    for folder in (run_dir.choice(index) for index in indices):
        try:
            record = ChoiceRecord.from_json(json.loads(folder.record.read_text()))
            architecture = Architecture.from_json(json.loads(folder.architecture.read_text()))
        except (OSError, ValueError):  # being written, or another PipeBD's (DocumentError is a ValueError)
            continue
        found.append((record, architecture))
    return found


def engine_events(job: Job, limit: int = ENGINE_EVENTS) -> list[dict[str, Any]]:
    """The newest lines of the run's events.jsonl (prepared, launched, rank_started, checkpoint, ...)."""
    return [] if job.run_dir is None else RunDir(Path(job.run_dir)).read_events(limit)


def architecture_steps(session: Session, job: Job) -> dict[int, list[int]]:
    """NAS jobs: per block, the training steps at which its architecture was updated, ascending (one scan
    of the job's lines for their `round` and `blocks`, without decoding their probabilities)."""
    record = col(JobMetric.record)
    query = select(JobMetric.step, record["blocks"]).where(
        JobMetric.job_id == job.id, record["round"].as_string() == "arch"
    )
    steps: dict[int, set[int]] = {}
    for step, blocks in session.exec(query).all():
        for block in blocks or []:
            steps.setdefault(int(block), set()).add(int(step))
    return {block: sorted(found) for block, found in sorted(steps.items())}


def architecture_history(
    session: Session, job: Job, steps: dict[int, list[int]]
) -> dict[int, list[tuple[int, list[list[float]]]]]:
    """NAS jobs: per block, (step, probabilities of each layer's candidates) at the block's architecture
    updates of `steps`, oldest first. An update reported by several ranks (replicas) is taken once, from
    the lowest rank."""
    wanted = sorted({step for block_steps in steps.values() for step in block_steps})
    if not wanted:
        return {}
    record = col(JobMetric.record)
    query = (
        select(JobMetric.step, record["arch"])
        .where(JobMetric.job_id == job.id, col(JobMetric.step).in_(wanted), record["round"].as_string() == "arch")
        .order_by(col(JobMetric.step), col(JobMetric.rank))
    )
    chosen = {block: set(block_steps) for block, block_steps in steps.items()}
    found: dict[int, dict[int, list[list[float]]]] = {}
    for step, arch in session.exec(query).all():
        for block, layers in (arch or {}).items():
            if int(step) in chosen.get(int(block), ()):
                found.setdefault(int(block), {}).setdefault(int(step), layers)
    return {block: sorted(updates.items()) for block, updates in sorted(found.items())}
