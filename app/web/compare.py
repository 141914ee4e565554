"""The compare page (`/compare?ids=1,2`): jobs side by side, e.g. one spec in `dp` and in `auto`.

Up to MAX_COMPARED jobs by id, the detailed view below with live curves. More ids, a sweep
(`?sweep_id=3`) or a filter (`?state=succeeded`, `?name=lr`) give the paged view instead: the same
comparison as GET /api/v1/compare (app/services/compare.py), sorted and paged on the server, with the spec
fields that differ (or all of them: `all_fields=true`) and the loss per block as min/max/final.

One table (mode, ranks, the jobs' figures as app/core/figures.py stores them: samples/s, measured step,
busy share, speed-up over the baseline (or `within noise`), peak memory;
final loss per block; for jobs that trained end to end, top-1 before and after with the teacher's,
parameters; every phase's wall time) and overlaid curves drawn by the page's script, which follows each unfinished
job's event stream and re-fetches the table (`/compare/partials/table`) as metrics arrive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from sqlmodel import Session, col, select

from app.api.deps import SessionDep
from app.core.states import FINAL, STATES
from app.core.summaries import read_summary
from app.core.tables import DB_INT_MAX, Job
from app.services import compare as paged
from app.services.errors import EXCERPT_CHARS, excerpt
from app.web import queries
from app.web.access import ViewerDep
from app.web.analysis import JobSummary, summarize
from app.web.routing import PageRoute
from app.web.templating import render
from app.web.views import PhaseStep, mode_text, phase_timeline, plan_detail
from pipebd_core.documents.summary import FinetuneReport
from pipebd_core.figures import Speedup, speedup

MAX_COMPARED = 4  # each unfinished job holds an event stream open; browsers allow six connections per host
PICKER_JOBS = 20  # recent jobs offered as checkboxes when no ids are given

router = APIRouter(route_class=PageRoute)
IdsQuery = Annotated[str | None, Query(description="job ids separated by commas, e.g. 3,4")]
IdQuery = Annotated[list[str] | None, Query(description="a job id; repeat for several")]
PAGE_ROWS = 50  # rows per page of the paged view


@dataclass
class Compared:
    job: Job
    mode: str  # as submitted (`auto`, not what auto chose): `dp` jobs are the baseline
    summary: JobSummary
    speedup: Speedup | None = None  # over the baseline's samples/s, `within noise` inside their spread
    baseline: bool = False
    shown_mode: str = ""  # `dp`, `auto → hybrid`: what the mode column and the curves' legend say
    plan: str | None = None  # the plan in a few words (its stages), once planned
    finetune: FinetuneReport | None = None  # summary.json's end-to-end training report, once evaluated
    phases: list[PhaseStep] = field(default_factory=list)


def parse_ids(ids: str | None, id_list: list[str] | None) -> list[int]:
    """Distinct job ids in the order given; ValueError saying what is wrong."""
    raw = [part.strip() for part in (ids or "").split(",") if part.strip()] + [v.strip() for v in id_list or []]
    bad = [value for value in raw if not paged.is_job_id(value)]
    if bad:
        raise ValueError(
            f"{excerpt(repr(bad[0]), EXCERPT_CHARS)} is not a job id; give job ids separated by commas, e.g. 3,4"
        )
    return list(dict.fromkeys(int(value) for value in raw))


def load_jobs(session: Session, ids: list[int]) -> list[Job]:
    jobs = []
    for job_id in ids:
        job = session.get(Job, job_id)
        if job is None:
            raise ValueError(f"job {job_id} does not exist (it may have been deleted)")
        jobs.append(job)
    return jobs


def compared(session: Session, job: Job) -> Compared:
    written = read_summary(job)
    final_loss = written.final_loss if written is not None else None
    plan = job.plan_summary or {}
    summary = summarize(
        job,
        queries.recent_lines(session, job),
        {str(block): loss for block, loss in final_loss.items()} if final_loss else None,
    )
    mode = job.spec.get("schedule", {}).get("mode") or plan.get("mode") or "?"
    return Compared(
        job,
        str(mode),
        summary,
        shown_mode=mode_text(job),
        plan=plan_detail(job),
        finetune=written.finetune if written is not None else None,
        phases=phase_timeline(job),
    )


def with_speedups(rows: list[Compared]) -> list[Compared]:
    """Speed-up over the first measured `dp` job, or over the first measured job when none runs `dp`; within
    noise where the difference lies inside the two jobs' spread (pipebd_core.figures.speedup)."""
    measured = [row for row in rows if row.summary.samples_per_s]
    if not measured:
        return rows
    baseline = next((row for row in measured if row.mode == "dp"), measured[0])
    baseline.baseline = True
    base = baseline.summary
    for row in rows:
        if row is baseline:
            row.speedup = Speedup(1.0, within_noise=False)  # 1.00: what the others are measured against
        elif row.summary.samples_per_s and base.samples_per_s:
            row.speedup = speedup(row.summary.samples_per_s, row.summary.spread, base.samples_per_s, base.spread)
    return rows


def comparison(session: Session, ids: str | None, id_list: list[str] | None) -> tuple[list[Compared], str | None]:
    try:
        wanted = parse_ids(ids, id_list)
        if len(wanted) > MAX_COMPARED:
            raise ValueError(f"at most {MAX_COMPARED} jobs side by side, got {len(wanted)}; /compare pages more")
        jobs = load_jobs(session, wanted)
    except ValueError as error:
        return [], str(error)
    return with_speedups([compared(session, job) for job in jobs]), None


def script_config(session: Session, rows: list[Compared]) -> list[dict[str, Any]]:
    return [
        {
            "id": row.job.id,
            "name": row.job.name,
            "mode": row.shown_mode,
            "final": row.job.state in FINAL,
            "startedAt": row.job.started_at,
            "batchSize": int(row.job.spec.get("data", {}).get("batch_size") or 1),
            "numBlocks": (row.job.plan_summary or {}).get("num_blocks"),
            "afterEventId": queries.last_event_id(session, row.job.id or 0),
        }
        for row in rows
    ]


@dataclass
class Paged:
    """The paged view: one page of the comparison and the links that sort, page and toggle it."""

    comparison: paged.Comparison
    params: dict[str, str]  # the query that selected it, without sort, offset and all_fields

    def url(self, **changes: object) -> str:
        query = {
            **self.params,
            "sort": self.comparison.sort,
            "offset": self.comparison.offset,
            "all_fields": "true" if self.comparison.all_fields else "",
            **changes,
        }
        return "/compare?" + urlencode({key: value for key, value in query.items() if value not in ("", None, 0)})

    def sort_url(self, column: str) -> str:
        """Sort by `column`, ascending; descending when it already sorts ascending."""
        return self.url(sort=f"-{column}" if self.comparison.sort == column else column, offset=0)

    def arrow(self, column: str) -> str:
        return {column: " ▲", f"-{column}": " ▼"}.get(self.comparison.sort, "")

    @property
    def previous_url(self) -> str | None:
        offset = self.comparison.offset
        return self.url(offset=max(0, offset - PAGE_ROWS)) if offset > 0 else None

    @property
    def next_url(self) -> str | None:
        following = self.comparison.next_offset
        return self.url(offset=following) if following is not None else None


def paged_view(
    session: Session, ids: list[int], sweep_id: int | None, state: str | None, name: str | None, query: dict[str, Any]
) -> Paged:
    """The paged comparison; ValueError saying what is wrong with the query."""
    if state is not None and state not in STATES:
        raise ValueError(f"{excerpt(repr(state), EXCERPT_CHARS)} is not a job state; one of {', '.join(STATES)}")
    if len(ids) > paged.MAX_IDS:
        raise ValueError(f"at most {paged.MAX_IDS} ids; compare a sweep or a filter instead")
    selection = paged.Selection(ids=ids or None, sweep_id=sweep_id, state=state, name=name)
    comparison = paged.compare(
        session,
        selection,
        sort=str(query.get("sort") or "id"),
        limit=PAGE_ROWS,
        offset=int(query.get("offset") or 0),
        all_fields=bool(query.get("all_fields")),
    )
    params = {"ids": ",".join(map(str, ids)), "sweep_id": sweep_id or "", "state": state or "", "name": name or ""}
    return Paged(comparison, {key: str(value) for key, value in params.items() if value})


@router.get("/compare", response_class=HTMLResponse)
def compare_page(
    request: Request,
    viewer: ViewerDep,
    session: SessionDep,
    ids: IdsQuery = None,
    id: IdQuery = None,
    sweep_id: Annotated[int | None, Query(ge=1, le=DB_INT_MAX, description="the children of this sweep")] = None,
    state: Annotated[str | None, Query(max_length=20, description="only jobs in this state")] = None,
    name: Annotated[str | None, Query(max_length=100, description="only jobs whose name contains this")] = None,
    sort: Annotated[str, Query(max_length=200, description="the sort column, `-` before it: descending")] = "id",
    offset: Annotated[int, Query(ge=0, le=DB_INT_MAX, description="rows to skip")] = 0,
    all_fields: Annotated[bool, Query(description="every spec field, not only those that differ")] = False,
) -> HTMLResponse:
    problem: str | None = None
    try:
        wanted = parse_ids(ids, id)
    except ValueError as error:
        wanted, problem = [], str(error)
    if problem is None and (len(wanted) > MAX_COMPARED or sweep_id or state or name):
        try:
            query = {"sort": sort, "offset": offset, "all_fields": all_fields}
            view = paged_view(session, wanted, sweep_id, state, name, query)
        except ValueError as refused:
            return render(request, "jobs/compare.html", form_context(session, [], str(refused), ids), status_code=422)
        return render(request, "jobs/compare.html", {**form_context(session, [], None, ids or ""), "paged": view})
    rows: list[Compared] = []
    shown = problem
    if problem is None:
        rows, shown = comparison(session, ids, id)
    context = form_context(session, rows, shown, ids)
    return render(request, "jobs/compare.html", context, status_code=422 if shown else 200)


def form_context(session: Session, rows: list[Compared], error: str | None, ids: str | None) -> dict[str, Any]:
    recent = session.exec(select(Job).order_by(col(Job.id).desc()).limit(PICKER_JOBS)).all()
    return {
        "rows": rows,
        "error": error,
        "ids_text": ids if error or not rows else ",".join(str(row.job.id) for row in rows),
        "recent": [(job, mode_text(job)) for job in recent],
        "config": script_config(session, rows),
        "max_compared": MAX_COMPARED,
        "paged": None,
    }


@router.get("/compare/partials/table", response_class=HTMLResponse)
def compare_table(request: Request, viewer: ViewerDep, session: SessionDep, ids: IdsQuery = None) -> HTMLResponse:
    rows, error = comparison(session, ids, None)
    return render(request, "partials/compare_table.html", {"rows": rows, "error": error}, 422 if error else 200)
