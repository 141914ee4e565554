"""The dashboard seam: HTML views live here (templates/ and the pages are built by the dashboard work).

Until then `/` serves a placeholder pointing at the API documentation. Dashboard routes use the same
`read` authorization as the API (a `pipebd_token` cookie works where a browser cannot send headers).
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from app.deps import ReadAccess

router = APIRouter(include_in_schema=False)

PLACEHOLDER = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>PipeBD</title></head>
<body><h1>PipeBD</h1>
<p>The job service is running. The dashboard is not built yet; use the API:
<a href="/docs">interactive documentation</a>, <a href="/api/v1/jobs">jobs</a>.</p>
</body></html>
"""


@router.get("/", dependencies=[ReadAccess])
def home() -> HTMLResponse:
    return HTMLResponse(PLACEHOLDER)
