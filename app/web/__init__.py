"""The browser dashboard: server-rendered pages (templates/ at the repository root) whose scripts
(app/static/js) follow each job's event stream and update the page in place.

`install(app)` adds the pages and serves app/static under `/static`. Pages use the API's tokens: with
`PIPEBD_API_TOKENS` set they ask for a token once and keep it in the `pipebd_token` cookie.
"""

from __future__ import annotations

import os

from fastapi import FastAPI
from starlette.responses import Response
from starlette.staticfiles import PathLike, StaticFiles
from starlette.types import Scope

from app.web import access, compare, job_page, jobs_list, models, new_job, sweeps, webhooks
from app.web.templating import STATIC


class RevalidatedStaticFiles(StaticFiles):
    """Static files that browsers revalidate (a cheap 304) so an upgrade never runs stale scripts."""

    def file_response(
        self, full_path: PathLike, stat_result: os.stat_result, scope: Scope, status_code: int = 200
    ) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers["Cache-Control"] = "no-cache"
        return response


def install(app: FastAPI) -> None:
    # /jobs/new before /jobs/{job_id}: "new" is not a job id
    for module in (access, jobs_list, new_job, job_page, compare, sweeps, webhooks, models):
        app.include_router(module.router, include_in_schema=False)
    app.mount("/static", RevalidatedStaticFiles(directory=STATIC), name="static")
