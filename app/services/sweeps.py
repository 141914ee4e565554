"""Sweeps: many jobs from one base spec, created, followed and paused, resumed or cancelled as one unit.

Creating one (`POST /api/v1/sweeps`), all or nothing:

1. the client's rate, as for a job (app/services/submissions.py);
2. the search makes the children (app/services/search.py), and each is checked as a whole spec
   (app/services/specs.py): a problem in one child refuses the sweep, naming the override that caused it
   (`grid.train.lr`, `list.2.train.lr`, `random.fields.train.lr`) or the base spec's field (`spec.train.epochs`);
3. the queue's capacity for every child;
4. the engine's preflight of each distinct child, in a helper process;
5. the sweep and its children stored in one transaction, then each child's id published; a child the broker
   refused removes the sweep and every child again.

Each child is an ordinary job with `sweep_id` and its overrides (`sweep_overrides`): priorities, automatic
restarts, pause, resume and cancel all work on it alone too. `max_parallel` is held by the claim
(app/core/sweeps.py). A sweep's state, progress and best child are read from its children when asked.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from dataclasses import dataclass, field

import anyio
from celery import Celery
from sqlalchemy import delete
from sqlmodel import Session, col, select

from app.core.database import get_engine
from app.core.lifecycle import request_cancel
from app.core.objectives import Best, best_of, metric_value
from app.core.queue import enqueue
from app.core.settings import Settings
from app.core.states import FINAL, RESUMABLE, STATES
from app.core.sweeps import SweepState, sweep_state
from app.core.tables import Job, Sweep
from app.core.webhooks import forget_sweep, notify_state
from app.services.errors import ABSENT, FieldProblem, ServiceError, field_problem, invalid, summary, where
from app.services.jobs import ConflictError, QueueFull, discard_jobs, new_job, queued_event, take_queue_room
from app.services.resume import PAUSABLE, pause_job, resume_job
from app.services.search import Child, Objective, SearchError, SweepRequest, children, override_loc
from app.services.specs import check_values, spec_hash, validate_document
from app.services.submissions import (
    Submitter,
    admit_rate,
    check_capacity,
    in_thread,
    preflight,
    queue_full,
    resolve_references,
)
from pipebd_core.spec import Spec

Checked = list[tuple[Child, Spec]]  # each child with its validated spec


# --- creating ------------------------------------------------------------------------------------------


def blamed_override(child: Child, field_path: str) -> str | None:
    """The child's override that a problem on `field_path` comes from: the same field, or one inside it."""
    for path in child.overrides:
        if field_path == path or field_path.startswith(path + ".") or path.startswith(field_path + "."):
            return path
    return None


def relocated(request: SweepRequest, child: Child, problems: list[FieldProblem]) -> list[FieldProblem]:
    """A child's spec problems at the override that caused each (else at the base spec's field)."""
    moved = []
    for item in problems:
        field_path = where(item) if item.get("loc") != ["body"] else ""
        path = blamed_override(child, field_path)
        loc: list[str | int]
        if path is None:
            loc = ["spec", *field_path.split(".")] if field_path else ["spec"]
            message = f"in the base spec: {item['message']}"
        else:
            loc = override_loc(request, child.index, path)
            shown = child.overrides[path]
            message = f"child {child.index} ({path}={shown!r}): {field_path}: {item['message']}"
        moved.append(field_problem(["body", *loc], message, item.get("value", ABSENT)))
    return moved


def checked_children(request: SweepRequest, settings: Settings) -> Checked:
    """Every child of the request validated as a whole spec; a 422 naming each bad override otherwise."""
    try:
        made = children(request)
    except SearchError as error:
        raise invalid(["body", *error.loc], str(error)) from None
    problems: list[FieldProblem] = []
    checked: Checked = []
    for child in made:
        try:
            check_values(child.document)  # finite numbers, a bounded document: as a job's body is checked
            document, allowed = resolve_references(child.document, settings)  # {model: N}, as a job's
            checked.append((child, validate_document(document, settings, allowed)))
        except ServiceError as error:
            if not error.errors:  # not about a field (a document too large): as it is
                raise
            problems += [item for item in relocated(request, child, error.errors) if item not in problems]
    if problems:
        raise ServiceError(422, f"the sweep was refused, nothing was stored: {summary(problems)}", problems)
    return checked


async def preflight_children(submitter: Submitter, body: SweepRequest, checked: Checked) -> None:
    """The engine's preflight of each distinct child (the same spec is checked once), each within the bound."""
    settings = submitter.settings
    seen: set[str] = set()
    for child, spec in checked:
        if spec_hash(spec) in seen:
            continue
        seen.add(spec_hash(spec))
        limiter = submitter.checker_threads
        try:
            await anyio.to_thread.run_sync(preflight, submitter, spec, settings.spec_check_timeout_s, limiter=limiter)
        except ServiceError as error:
            if error.status != 422:
                raise
            problems = relocated(body, child, error.errors)
            raise ServiceError(
                422, f"the sweep was refused, nothing was stored: {summary(problems)}", problems
            ) from None


def store_sweep(submitter: Submitter, body: SweepRequest, checked: Checked) -> Sweep:
    """The sweep and its queued children in one transaction, then each child's id on the broker (all or none)."""
    settings, celery = submitter.settings, submitter.celery
    with Session(get_engine(settings.database), expire_on_commit=False) as session:
        objective = body.objective.model_dump() if body.objective else None
        name = body.name or checked[0][1].name
        sweep = Sweep(name=name, spec=body.spec, search=body.search(), objective=objective)
        sweep.max_parallel = body.max_parallel
        try:  # the queue's room is taken under its lock, with the children's rows, as a job's is
            take_queue_room(session, settings.max_queued_jobs, len(checked))
        except QueueFull as full:
            raise queue_full(full.queued, settings, len(checked)) from None
        session.add(sweep)
        session.flush()
        tenant = submitter.tenant
        jobs = [
            new_job(
                spec, sweep_id=sweep.id, sweep_overrides=child.overrides, request_hash=spec_hash(spec), tenant=tenant
            )
            for child, spec in checked
        ]
        session.add_all(jobs)
        session.flush()
        for job in jobs:  # each child is an ordinary job: its `job.queued` deliveries with its first event
            assert job.id is not None
            session.add(queued_event(job.id))
            notify_state(session, job.id, job.created_at)
        session.commit()
        try:
            for job in jobs:
                assert job.id is not None
                enqueue(celery, job.id, job.queue)
        except Exception as error:
            discard_jobs(session, job_ids=[job.id for job in jobs if job.id is not None])
            assert sweep.id is not None
            forget_sweep(session, sweep.id)  # a hook created for it meanwhile goes with it
            session.execute(delete(Sweep).where(col(Sweep.id) == sweep.id))
            session.commit()
            detail = f"the broker did not accept the sweep's jobs ({type(error).__name__}: {error}); nothing was stored"
            raise ServiceError(503, detail + ", retry") from None
        return sweep


async def submit_sweep(submitter: Submitter, body: SweepRequest) -> Sweep:
    """Steps 1 to 5; raises ServiceError with the status and problems of the first step that refuses."""
    settings = submitter.settings
    await anyio.to_thread.run_sync(admit_rate, settings, submitter.client)
    deadline = time.monotonic() + settings.spec_check_timeout_s
    checked: Checked = await in_thread(deadline, settings, checked_children, body, settings)
    await anyio.to_thread.run_sync(check_capacity, settings, submitter.tenant, len(checked))
    await preflight_children(submitter, body, checked)
    sweep: Sweep = await anyio.to_thread.run_sync(store_sweep, submitter, body, checked)
    return sweep


# --- reading -------------------------------------------------------------------------------------------


@dataclass
class Progress:
    jobs: dict[str, int]  # children per state, every state named
    total: int
    finished: int  # children in a final state
    fraction: float  # the mean of the children's progress, an ended child counting as done


@dataclass
class SweepView:
    """A sweep with what its children say: state, progress, objective values and the best child."""

    sweep: Sweep
    children: list[Job]
    state: SweepState
    progress: Progress
    values: dict[int, float | None] = field(default_factory=dict)  # per child: its objective value now
    best: Best | None = None

    @property
    def objective(self) -> Objective | None:
        return Objective.model_validate(self.sweep.objective) if self.sweep.objective else None


def progress_of(jobs: list[Job]) -> Progress:
    counts = Counter(job.state for job in jobs)
    done = [1.0 if job.state in FINAL else job.progress for job in jobs]
    finished = sum(counts[state] for state in FINAL)
    fraction = sum(done) / len(done) if done else 0.0
    return Progress({state: counts[state] for state in STATES}, len(jobs), finished, fraction)


def children_of(session: Session, sweep_id: int) -> list[Job]:
    return list(session.exec(select(Job).where(Job.sweep_id == sweep_id).order_by(col(Job.id))).all())


def sweep_view(session: Session, sweep: Sweep) -> SweepView:
    assert sweep.id is not None
    jobs = children_of(session, sweep.id)
    view = SweepView(sweep, jobs, sweep_state([job.state for job in jobs]), progress_of(jobs))
    objective = view.objective
    if objective is not None:
        view.values = {job.id: metric_value(job, objective.metric) for job in jobs if job.id is not None}
        view.best = best_of(view.values, objective)
    return view


def list_sweeps(session: Session, limit: int) -> list[Sweep]:
    """The newest `limit` sweeps, newest first."""
    return list(session.exec(select(Sweep).order_by(col(Sweep.id).desc()).limit(limit)).all())


# --- acting on every child -----------------------------------------------------------------------------


def pause_sweep(session: Session, jobs: list[Job]) -> None:
    """Pause every queued or launched child (app/services/resume.py's pause, child by child)."""
    for job in jobs:
        if job.state in PAUSABLE:
            with contextlib.suppress(ConflictError):  # it ended or is being cancelled meanwhile: nothing to pause
                pause_job(session, job)


def resume_sweep(session: Session, settings: Settings, celery: Celery, jobs: list[Job]) -> tuple[int, list[str]]:
    """Resume every failed, cancelled or paused child; returns how many resumed, and why the others did not."""
    resumed, problems = 0, []
    for job in jobs:
        if job.state in RESUMABLE:
            try:
                resume_job(session, settings, celery, job)
                resumed += 1
            except ConflictError as error:
                problems.append(str(error))
    return resumed, problems


def cancel_sweep(session: Session, jobs: list[Job]) -> None:
    """Cancel every child: queued and paused ones end at once, launched ones are stopped by their workers."""
    for job in jobs:
        assert job.id is not None
        request_cancel(session, job.id)
    session.commit()
