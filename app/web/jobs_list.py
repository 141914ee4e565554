"""The jobs list (`/`): state, progress, samples/s, duration and ETA, plan, filter, cursor pages.

`/partials/jobs` renders only the table rows for the same filter and page; the page's script
fetches it every few seconds and replaces the rows that changed, so the list stays live without a
reload.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from app.api.deps import SessionDep
from app.core.states import STATES
from app.services.jobs import list_jobs
from app.web.access import ViewerDep
from app.web.routing import PageRoute
from app.web.templating import render
from app.web.views import JobRow, job_row

PAGE_SIZE = 25  # jobs per page of the list
REFRESH_S = 2  # how often the page's script refreshes the rows

router = APIRouter(route_class=PageRoute)
StateQuery = Annotated[str | None, Query(description="only jobs in this state")]
CursorQuery = Annotated[str | None, Query(description="the next_cursor of the previous page")]


@dataclass
class Listing:
    state: str | None
    cursor: str | None
    rows: list[JobRow] = field(default_factory=list)
    next_cursor: str | None = None
    errors: dict[str, str] = field(default_factory=dict)  # field -> message shown next to it

    def page_url(self, cursor: str | None = None, path: str = "/") -> str:
        """This filter at the page after `cursor` (None: the newest page)."""
        query = urlencode({key: value for key, value in (("state", self.state), ("cursor", cursor)) if value})
        return f"{path}?{query}" if query else path


def listing(session: SessionDep, state: str | None, cursor: str | None) -> Listing:
    result = Listing(state or None, cursor or None)
    if result.state is not None and result.state not in STATES:
        result.errors["state"] = f"{result.state!r} is not a job state; pick one of {', '.join(STATES)}."
        return result
    try:
        jobs, result.next_cursor = list_jobs(session, state=result.state, limit=PAGE_SIZE, cursor=result.cursor)
    except ValueError as error:
        result.errors["cursor"] = f"{error}. Start again from the newest jobs."
        return result
    result.rows = [job_row(job) for job in jobs]
    return result


@router.get("/", response_class=HTMLResponse)
def jobs_page(
    request: Request, viewer: ViewerDep, session: SessionDep, state: StateQuery = None, cursor: CursorQuery = None
) -> HTMLResponse:
    found = listing(session, state, cursor)
    context = {"listing": found, "states": STATES, "refresh_s": REFRESH_S}
    return render(request, "jobs/list.html", context, status_code=422 if found.errors else 200)


@router.get("/partials/jobs", response_class=HTMLResponse)
def jobs_rows(
    request: Request, viewer: ViewerDep, session: SessionDep, state: StateQuery = None, cursor: CursorQuery = None
) -> HTMLResponse:
    found = listing(session, state, cursor)
    return render(request, "partials/job_rows.html", {"listing": found}, status_code=422 if found.errors else 200)
