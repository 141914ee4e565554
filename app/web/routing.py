"""How dashboard routes answer when they cannot show the page: login redirect, read-only, not found, an
address whose parameters are not valid.

Pages raise `LoginRequired`, `ReadOnly` or `PageError`; `PageRoute` turns them into a redirect to the
login page or an HTML error page (the API's routes keep answering JSON).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import quote

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse
from fastapi.routing import APIRoute

from app.services.errors import pydantic_problems, summary
from app.web.templating import render


class LoginRequired(Exception):
    """No known token: ask for one, then come back to `target`."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.target = target


class PageError(Exception):
    """A page that cannot be shown, with the status and a sentence saying why and what would work."""

    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status, self.title, self.message = status, title, message


class ReadOnly(PageError):
    def __init__(self) -> None:
        super().__init__(
            403,
            "Read-only token",
            "Your token has the read scope: it can look at jobs but not submit or cancel them."
            " Log out and log in with a submit token to do that.",
        )


def safe_next(target: str | None) -> str:
    """Only paths on this site: never `//host` or an absolute URL (no open redirect)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def login_url(target: str) -> str:
    return f"/login?next={quote(safe_next(target), safe='/')}"


class PageRoute(APIRoute):
    """An APIRoute whose page exceptions become a login redirect or an HTML error page."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except LoginRequired as missing:
                return RedirectResponse(login_url(missing.target), status_code=303)
            except PageError as error:
                context = {"title": error.title, "message": error.message}
                return render(request, "error.html", context, status_code=error.status)
            except RequestValidationError as error:  # e.g. /jobs/abc: the same words as the API's problem
                context = {"title": "Not a page of this site", "message": summary(pydantic_problems(error.errors()))}
                return render(request, "error.html", context, status_code=422)

        return route
