"""The job page (`/jobs/{id}`) and its server-rendered parts.

The page is drawn once with every part; its script then follows the job's event stream, appends
points to the charts and re-fetches a part (`/jobs/{id}/partials/{name}`) when what it shows may
have changed: the status on state and metric events, the bottleneck on metric events, the plan,
artifacts and events on state changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from sqlmodel import Session

from app.api.deps import JobId, SessionDep, SettingsDep
from app.core import gangs
from app.core.attempts import attempts_of, rank_hosts, shape_notes
from app.core.figures import step_of
from app.core.json_types import JsonObject
from app.core.states import FINAL, SUCCEEDED
from app.core.tables import GangSeat, Job, JobAttempt, JobEvent
from app.services.artifacts import available
from app.services.jobs import waiting_reason
from app.web import queries
from app.web.access import ViewerDep
from app.web.analysis import LABELS, Finding, find_bottleneck
from app.web.architecture import MAX_COLUMNS, BlockHistory, architecture_view, spaced
from app.web.finetune import (
    FinetuneView,
    finetune_view,
    has_finetune,
    language_model,
    predicted_schedule,
    trains_blocks,
)
from app.web.outcome import OutcomeView, outcome_view
from app.web.routing import PageError, PageRoute
from app.web.templating import render
from app.web.views import JobRow, PhaseStep, PlanView, job_row, phase_timeline, plan_view
from pipebd_core.documents.base import DocumentError
from pipebd_core.documents.distill_plan import PlanDocument
from pipebd_core.documents.phases import DISTILL, FINETUNE
from pipebd_core.documents.telemetry import DistillLine
from pipebd_core.figures import RankLoad, peak_mem, rank_loads
from pipebd_core.job.outcomes import TERMINATION_REASONS
from pipebd_core.job.phases import PHASE_KINDS
from pipebd_core.rundir import Output

router = APIRouter(route_class=PageRoute)
GANTT_LINES = 8  # newest telemetry lines per rank handed to the page for the measured schedule
HISTORY_POINTS = 500  # chart points per rank the page starts from (the server downsamples to these)


class StatusPart(TypedDict):
    """The status part: the job's row and figures, why it waits or how it ended, its phases and attempts."""

    row: JobRow
    step_s: float | None
    waiting: str | None
    explanation: str | None
    phases: list[PhaseStep]
    attempts: list[JobAttempt]
    attempt_notes: list[str | None]
    gang: list[GangSeat]


class BottleneckPart(TypedDict):
    """The bottleneck part: each rank's load and peak memory, the finding, the load's labels, the hosts."""

    loads: list[RankLoad]
    finding: Finding
    labels: dict[str, str]
    memory: dict[int, int | None]
    hosts: dict[int, str]


class PlanPart(TypedDict):
    """The plan part: the plan's view, or why plan.json could not be read, and the spec's schedule."""

    plan: PlanView | None
    error: str | None
    schedule: JsonObject  # the spec's schedule section as stored


class ArtifactsPart(TypedDict):
    """The artifacts part: what the job has to download now."""

    artifacts: list[tuple[Output, int | None, str]]  # artifact, size (None: generated), download path


class EventsPart(TypedDict):
    """The events part: the job's state changes and the engine's newest lifecycle events."""

    states: list[JobEvent]
    engine_events: list[JsonObject]  # the newest lines of events.jsonl (each event has its own fields)


class ArchitecturePart(TypedDict):
    """The architecture part: a NAS job's choices, block by block."""

    blocks: list[BlockHistory]  # NAS: each block's architecture updates; empty for another job


class FinetuneConfig(TypedDict):
    """What the page's script needs of the finetune phase."""

    enabled: bool
    predicted: list[dict[str, Any]]  # the planner's replayed step: finetune_plan.json's simulation (TrainSegment)
    perplexity: bool


class PageConfig(TypedDict):
    """What the page's script starts from (its JSON, read by static/js): ids, sizes, where to follow events."""

    id: int
    state: str
    final: bool
    nproc: int
    batchSize: int
    numBlocks: int | None
    startedAt: float | None
    finishedAt: float | None
    afterEventId: int
    hasPlan: bool
    predicted: dict[str, Any] | None  # the chosen plan's simulated timeline: plan.json's simulation.chosen (Timeline)
    hasLogs: bool
    recent: list[dict[str, Any]]  # the newest telemetry lines of each rank (DistillLine)
    canSubmit: bool
    finetune: FinetuneConfig
    distills: bool


class LogPhases(TypedDict):
    """The log panel's phases."""

    log_phases: list[str]  # the phases whose logs the panel offers
    log_phase: str  # the one it opens on


class JobParts:
    """Everything the page's parts show about one job, read lazily and at most once per request."""

    def __init__(self, session: Session, job: Job, stale_after_s: float) -> None:
        self.session, self.job, self.stale_after_s = session, job, stale_after_s
        self._plan: PlanDocument | None = None
        self._plan_error: str | None = None  # why plan.json could not be read (another version wrote it)
        self._plan_read = False
        self._recent: dict[int, list[DistillLine]] | None = None

    @property
    def plan(self) -> PlanDocument | None:
        if not self._plan_read:
            self._plan_read = True
            try:
                self._plan = queries.read_document(self.job, "plan.json", PlanDocument)
            except DocumentError as error:
                self._plan_error = str(error)
        return self._plan

    @property
    def rank_hosts(self) -> dict[int, str]:
        """The host each rank ran on in the newest attempt of a job on several nodes (empty on one node)."""
        if self.job.nodes == 1 or self.job.id is None:
            return {}
        attempts = attempts_of(self.session, self.job.id)
        return rank_hosts(attempts[-1] if attempts else None, self.job.nproc, self.job.world_size)

    @property
    def num_blocks(self) -> int | None:
        if self.job.plan_summary:
            return self.job.plan_summary.get("num_blocks")
        return self.plan.num_blocks if self.plan else None

    @property
    def batch_size(self) -> int:
        return int(self.job.spec.get("data", {}).get("batch_size") or 1)

    def status(self) -> StatusPart:
        reason = waiting_reason(self.session, job=self.job, stale_after_s=self.stale_after_s)
        explanation = TERMINATION_REASONS.get(self.job.termination_reason or "")
        attempts = attempts_of(self.session, self.job.id) if self.job.id is not None else []
        return {
            "row": job_row(self.job),
            "step_s": step_of(self.job),  # the job's figures (app/core/figures.py), as every page shows them
            "waiting": reason,
            "explanation": explanation,
            "phases": phase_timeline(self.job, replans=self.plan.details.replans if self.plan else ()),
            "attempts": attempts,
            "attempt_notes": shape_notes(attempts),
            "gang": gangs.seats(self.session, self.job.id) if self.job.id is not None and self.job.nodes > 1 else [],
        }

    @property
    def recent(self) -> dict[int, list[DistillLine]]:
        if self._recent is None:
            self._recent = queries.recent_lines(self.session, self.job)
        return self._recent

    def bottleneck(self) -> BottleneckPart:
        lines = self.recent
        loads = rank_loads(lines)
        memory = {rank: peak_mem({rank: rank_lines}) for rank, rank_lines in lines.items()}
        finding = find_bottleneck(loads, self.plan, step_of(self.job), ended=self.job.state in FINAL)
        hosts = self.rank_hosts
        return {"loads": loads, "finding": finding, "labels": LABELS, "memory": memory, "hosts": hosts}

    def plan_part(self) -> PlanPart:
        calibration = queries.read_calibration(self.job) if self.plan else None
        view = plan_view(self.plan, calibration, step_of(self.job)) if self.plan else None
        return {"plan": view, "error": self._plan_error, "schedule": self.job.spec.get("schedule", {})}

    def artifacts(self) -> ArtifactsPart:
        items = [
            (artifact, size, f"/api/v1/jobs/{self.job.id}/artifacts/{artifact.name}")
            for artifact, size in available(self.session, self.job)
        ]
        return {"artifacts": items}

    def events(self) -> EventsPart:
        assert self.job.id is not None
        return {
            "states": queries.state_history(self.session, self.job.id),
            "engine_events": queries.engine_events(self.job),
        }

    def architecture(self) -> ArchitecturePart:
        names = self.plan.block_names if self.plan else []
        searched = self.job.spec.get("workload", {}).get("kind") == "nas"
        if not searched:
            return {"blocks": []}
        steps = queries.architecture_steps(self.session, self.job)  # every update; at most MAX_COLUMNS drawn
        drawn = {block: [found[i] for i in spaced(len(found), MAX_COLUMNS)] for block, found in steps.items()}
        history = queries.architecture_history(self.session, self.job, drawn)
        return {"blocks": architecture_view(history, names, {block: len(found) for block, found in steps.items()})}

    def predicted_timeline(self) -> dict[str, Any] | None:
        """The planner's simulated timeline of the chosen plan (the Gantt chart's predicted half)."""
        predictions = self.plan.predictions if self.plan else None
        chosen = predictions.simulation.get("chosen") if predictions else None
        return chosen.to_json() if chosen else None

    def outcome(self) -> OutcomeView:
        return outcome_view(self.job)

    def finetune(self) -> FinetuneView:
        return finetune_view(self.job)

    def builders(self) -> dict[str, Callable[[], Any]]:
        return {
            "status": self.status,
            "finetune": self.finetune,
            "bottleneck": self.bottleneck,
            "plan": self.plan_part,
            "artifacts": self.artifacts,
            "events": self.events,
            "architecture": self.architecture,
            "outcome": self.outcome,
        }

    def config(self) -> PageConfig:
        """What the page's script needs to start: ids, sizes, and where to follow the events from."""
        assert self.job.id is not None
        return {
            "id": self.job.id,
            "state": self.job.state,
            "final": self.job.state in FINAL,
            "nproc": self.job.world_size,
            "batchSize": self.batch_size,
            "numBlocks": self.num_blocks,
            "startedAt": self.job.started_at,
            "finishedAt": self.job.finished_at,
            "afterEventId": queries.last_event_id(self.session, self.job.id),
            "hasPlan": self.plan is not None,
            "predicted": self.predicted_timeline(),
            "hasLogs": self.job.run_dir is not None,
            "recent": [line.to_json() for lines in self.recent.values() for line in lines[-GANTT_LINES:]],
            "canSubmit": False,
            "finetune": {
                "enabled": has_finetune(self.job),
                "predicted": predicted_schedule(self.job),
                "perplexity": language_model(self.job),
            },
            "distills": trains_blocks(self.job),
        }


def log_phases(job: Job) -> LogPhases:
    """The phases whose logs the log panel offers (those that run processes), and the one it opens on: the
    running phase, or the one a job failed or was cancelled in; once it succeeded, its distillation (or
    its end-to-end training, for a job that only trains)."""
    names = [entry["name"] for entry in job.phases or []] or list(PHASE_KINDS)  # before a worker prepared it
    logged = [name for name in names if PHASE_KINDS[name].runs != "local"]
    trained = FINETUNE if FINETUNE in logged and DISTILL not in logged else DISTILL
    where = job.phase if job.state != SUCCEEDED and job.phase in logged else trained
    current = where if where in logged else logged[0]
    return {"log_phases": logged, "log_phase": current}


def get_page_job(session: Session, job_id: int) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise PageError(404, "No such job", f"Job {job_id} does not exist (it may have been deleted).")
    return job


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(
    request: Request, job_id: JobId, viewer: ViewerDep, session: SessionDep, settings: SettingsDep
) -> HTMLResponse:
    job = get_page_job(session, job_id)
    parts = JobParts(session, job, settings.stale_after_s)
    config = {**parts.config(), "canSubmit": viewer.can_submit, "historyPoints": HISTORY_POINTS}
    context: dict[str, Any] = {"job": job, "config": config, "history_points": HISTORY_POINTS, **log_phases(job)}
    context.update(
        has_finetune=has_finetune(job),
        finetune_perplexity=language_model(job),
        distills=trains_blocks(job),
        rank_hosts=parts.rank_hosts,
    )
    for name, build in parts.builders().items():
        context[name] = build()
    return render(request, "jobs/detail.html", context)


@router.get("/jobs/{job_id}/partials/{name}", response_class=HTMLResponse)
def job_partial(
    request: Request, job_id: JobId, name: str, viewer: ViewerDep, session: SessionDep, settings: SettingsDep
) -> HTMLResponse:
    job = get_page_job(session, job_id)
    builders = JobParts(session, job, settings.stale_after_s).builders()
    if name not in builders:
        raise PageError(404, "No such part", f"A job page has no part {name!r}; parts: {', '.join(builders)}.")
    return render(request, f"partials/{name}.html", {"job": job, name: builders[name]()})
