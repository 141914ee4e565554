"""Who is looking at the dashboard: the token in the `pipebd_token` cookie, and the login page.

Without `PIPEBD_API_TOKENS` the dashboard is open and everyone may submit. With tokens, a page
request without a known token is sent to `/login`, which asks for the token once and keeps it in an
HTTP-only cookie (the API accepts that cookie too, so the pages' own requests and event streams are
authorized by it). A `read` token sees no submit or cancel controls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, Request
from fastapi.responses import RedirectResponse, Response

from app.api.auth import COOKIE, presented_token, scope_of
from app.core.settings import Scope
from app.web.routing import LoginRequired, PageRoute, ReadOnly, safe_next
from app.web.templating import render

COOKIE_MAX_AGE_S = 30 * 24 * 3600  # the token is asked for again after a month

router = APIRouter(route_class=PageRoute)


@dataclass(frozen=True)
class Viewer:
    auth: bool  # tokens are configured on this server
    scope: Scope | None  # the presented token's scope; None without a known token

    @property
    def can_submit(self) -> bool:
        return not self.auth or self.scope == "submit"


def viewer_of(request: Request) -> Viewer:
    tokens = request.app.state.settings.tokens
    if not tokens:
        return Viewer(auth=False, scope="submit")
    token = presented_token(request)
    return Viewer(auth=True, scope=scope_of(token, tokens) if token else None)


def page_viewer(request: Request) -> Viewer:
    """Dependency of every page: the viewer, or a redirect to the login page."""
    viewer = viewer_of(request)
    if viewer.auth and viewer.scope is None:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise LoginRequired(target)
    request.state.viewer = viewer
    return viewer


def submitter(viewer: Annotated[Viewer, Depends(page_viewer)]) -> Viewer:
    """Dependency of pages that submit: a read-only token gets a page saying so."""
    if not viewer.can_submit:
        raise ReadOnly()
    return viewer


ViewerDep = Annotated[Viewer, Depends(page_viewer)]
SubmitterDep = Annotated[Viewer, Depends(submitter)]


@router.get("/login")
def login_page(request: Request, next: str = "/") -> Response:
    if not request.app.state.settings.tokens:
        return RedirectResponse(safe_next(next), status_code=303)
    return render(request, "login.html", {"next": safe_next(next), "error": None})


@router.post("/login")
async def login(request: Request) -> Response:
    """Check the token from the form; keep it in the cookie and go on, or say what is wrong."""
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    token = (form.get("token") or [""])[0].strip()
    target = safe_next((form.get("next") or ["/"])[0])
    tokens = request.app.state.settings.tokens
    error = None
    if not token:
        error = "Enter the token your operator gave you (a PIPEBD_API_TOKENS entry)."
    elif scope_of(token, tokens) is None:
        error = "This server does not know that token; check it for typos or ask your operator."
    if error:
        return render(request, "login.html", {"next": target, "error": error}, status_code=401)
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        COOKIE,
        token,
        max_age=COOKIE_MAX_AGE_S,
        httponly=True,
        samesite="lax",  # not sent with other sites' POSTs: no cross-site submit or cancel
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


@router.post("/logout")
def logout() -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response
