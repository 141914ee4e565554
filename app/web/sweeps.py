"""The sweep pages: `/sweeps` lists the sweeps, `/sweeps/{id}` shows one: its state, progress, objective and
best child, its objective over time (app/web/objective_chart.py), and a table of its children (overrides,
state, progress, objective value) with bulk Pause, Resume and Cancel buttons. The page's script re-fetches
the sweep part (`/sweeps/{id}/partials/sweep`) every few seconds while the sweep has not ended.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from sqlmodel import Session

from app.api.deps import SessionDep, SweepId
from app.core.json_types import JsonObject
from app.core.states import CANCELLING, FINAL, RESUMABLE
from app.core.tables import Job, Sweep
from app.services.resume import PAUSABLE
from app.services.sweeps import SweepView, list_sweeps, sweep_view
from app.web.access import ViewerDep
from app.web.objective_chart import objective_chart
from app.web.routing import PageError, PageRoute
from app.web.templating import render
from app.web.views import JobRow, job_row

REFRESH_S = 2  # how often the page's script refreshes the sweep part
LISTED = 50  # sweeps on the list page, newest first

router = APIRouter(route_class=PageRoute)


@dataclass
class ChildRow:
    """A child in the sweep's table."""

    row: JobRow
    overrides: str  # `train.lr=0.01, train.epochs=2`
    value: float | None  # its objective value now
    best: bool


def overrides_text(overrides: JsonObject | None) -> str:
    return ", ".join(f"{path}={json.dumps(value)}" for path, value in (overrides or {}).items()) or "—"


def child_rows(view: SweepView) -> list[ChildRow]:
    best = view.best.job_id if view.best else None
    return [
        ChildRow(job_row(job), overrides_text(job.sweep_overrides), view.values.get(job.id or 0), job.id == best)
        for job in view.children
    ]


def actions(children: list[Job]) -> dict[str, bool]:
    """Which bulk buttons apply: a child to pause, to resume, to cancel."""
    states = {job.state for job in children}
    return {
        "pause": bool(states & set(PAUSABLE)),
        "resume": bool(states & RESUMABLE),
        "cancel": bool(states - FINAL - {CANCELLING}),
    }


def get_page_sweep(session: Session, sweep_id: int) -> Sweep:
    sweep = session.get(Sweep, sweep_id)
    if sweep is None:
        raise PageError(404, "No such sweep", f"Sweep {sweep_id} does not exist.")
    return sweep


def sweep_context(session: Session, sweep_id: int) -> dict[str, Any]:
    view = sweep_view(session, get_page_sweep(session, sweep_id))
    best = next((job for job in view.children if view.best and job.id == view.best.job_id), None)
    rows, chart = child_rows(view), objective_chart(view)
    return {"view": view, "rows": rows, "best_job": best, "actions": actions(view.children), "chart": chart}


@router.get("/sweeps", response_class=HTMLResponse)
def sweeps_page(request: Request, viewer: ViewerDep, session: SessionDep) -> HTMLResponse:
    views = [sweep_view(session, sweep) for sweep in list_sweeps(session, LISTED)]
    return render(request, "sweeps/list.html", {"views": views})


@router.get("/sweeps/{sweep_id}", response_class=HTMLResponse)
def sweep_page(request: Request, sweep_id: SweepId, viewer: ViewerDep, session: SessionDep) -> HTMLResponse:
    context = {**sweep_context(session, sweep_id), "refresh_s": REFRESH_S}
    return render(request, "sweeps/detail.html", context)


@router.get("/sweeps/{sweep_id}/partials/sweep", response_class=HTMLResponse)
def sweep_part(request: Request, sweep_id: SweepId, viewer: ViewerDep, session: SessionDep) -> HTMLResponse:
    return render(request, "partials/sweep.html", sweep_context(session, sweep_id))
