"""One error shape for every 4xx and 5xx: RFC 9457 problem details, `application/problem+json`.

A problem body says what went wrong (`detail`), lists each bad field (`errors`: its `loc`, the message
saying why and what would work, and a bounded excerpt of the value sent) and carries the request's
id (also in the `X-Request-ID` header of every response, and in the server log for a 500).

Routes and services raise `ServiceError` (app/services/errors.py, which also holds the field problems'
shape); `install(app)` converts both, FastAPI's validation errors, every other
HTTPException (unknown routes, 405s) and any unexpected exception into this shape, and adds the
request-size limit (413 before a body is parsed). Nothing here echoes more than `EXCERPT_CHARS` of a
value or `MESSAGE_CHARS` of a message, however large the request was.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.database import DATABASE_DOWN
from app.services.errors import (
    EXCERPT_CHARS,
    MESSAGE_CHARS,
    FieldProblem,
    ServiceError,
    excerpt,
    pydantic_problems,
    summary,
)

PROBLEM_JSON = "application/problem+json"
MAX_ERRORS = 50  # bad fields listed at most; the detail says how many more there were
REQUEST_ID_HEADER = "X-Request-ID"
ROUTED_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")  # what routes here answer (HEAD comes with GET)
log = logging.getLogger("pipebd.api")


def request_id(scope: Scope) -> str:
    state = scope.get("state") or {}
    return str(state.get("request_id", ""))


def problem_response(
    scope: Scope,
    status: int,
    detail: str,
    errors: Sequence[FieldProblem] = (),
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """The problem body of `status` for the request of `scope` (the one builder of every error body)."""
    shown = list(errors[:MAX_ERRORS])
    if len(errors) > len(shown):
        detail = f"{detail} ({len(errors) - len(shown)} more problems not listed)"
    body = {
        "type": "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": excerpt(detail, MESSAGE_CHARS),
        "instance": excerpt(scope.get("path", ""), EXCERPT_CHARS),
        "request_id": request_id(scope),
        "errors": shown,
    }
    return JSONResponse(body, status_code=status, headers=dict(headers or {}), media_type=PROBLEM_JSON)


def unmatched(request: Request, error: StarletteHTTPException) -> str:
    """What a bare 404 or 405 of the router means, and what would work."""
    if error.status_code == 404 and error.detail == HTTPStatus.NOT_FOUND.phrase:
        path = excerpt(request.url.path, EXCERPT_CHARS)
        return f"no route {request.method} {path}; the API is under /api/v1 (see /docs)"
    if error.status_code == 405:
        return f"{request.method} is not allowed here; this path answers {', '.join(allowed_methods(request))}"
    return str(error.detail)


def allowed_methods(request: Request) -> list[str]:
    """Every method some route of this path answers (the router's own 405 names only the first route's)."""
    return [
        method
        for method in ROUTED_METHODS
        if any(route.matches({**request.scope, "method": method})[0] == Match.FULL for route in request.app.routes)
    ]


async def http_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, StarletteHTTPException)
    headers = dict(error.headers or {})
    if error.status_code == 405:
        headers["Allow"] = ", ".join(allowed_methods(request))
    return problem_response(request.scope, error.status_code, unmatched(request, error), headers=headers)


async def service_error(request: Request, error: Exception) -> JSONResponse:
    """A service's refusal (app/services/errors.py) as the problem body of its status."""
    assert isinstance(error, ServiceError)
    return problem_response(request.scope, error.status, error.detail, error.errors, error.headers)


async def validation_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    errors = pydantic_problems(error.errors())
    return problem_response(request.scope, 422, summary(errors), errors)


def database_down(error: BaseException) -> str | None:
    """The 503 detail for an error that says the database cannot be reached, else None."""
    if not isinstance(error, DATABASE_DOWN):
        return None
    cause = str(getattr(error, "orig", None) or error).strip().splitlines()[0]
    return (
        f"the database does not answer ({excerpt(cause, EXCERPT_CHARS)}); nothing was changed by this request:"
        " retry once it is back (GET /healthz says when)"
    )


class RequestContext:
    """Outermost layer: a request id for every request (state and `X-Request-ID`), a 503 problem while the
    database cannot be reached, and a 500 problem with that id for any other exception nothing else handled,
    logged once with its traceback under the same id."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", []), (REQUEST_ID_HEADER.lower().encode(), rid.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as error:
            outage = database_down(error)
            if outage is not None:
                log.warning("request %s: %s", rid, outage)
                if not started:
                    await problem_response(scope, 503, outage, headers={"Retry-After": "5"})(
                        scope, receive, send_with_id
                    )
                return
            path = excerpt(scope.get("path", ""), EXCERPT_CHARS)
            log.error("request %s: %s %s failed: %s: %s", rid, scope["method"], path, type(error).__name__, error,
                      exc_info=error)  # fmt: skip
            if not started:
                detail = (
                    f"the server failed on this request (request id {rid}); the error is in the server's log under"
                    " that id: report it to the operator, or retry if it was a passing fault"
                )
                await problem_response(scope, 500, detail)(scope, receive, send_with_id)


class BodyTooLarge(ServiceError):
    def __init__(self, limit: int) -> None:
        super().__init__(
            413,
            f"the request body is larger than this server's limit of {limit} bytes (PIPEBD_MAX_BODY_BYTES);"
            " a spec is a few kilobytes: send a smaller one",
        )


class BodyLimit:
    """413 for a body over `limit` bytes: at once from Content-Length, or as soon as a streamed body passes it
    (the body is never read further, let alone parsed)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            error = BodyTooLarge(self.limit)
            await problem_response(scope, 413, str(error.detail), headers={"Connection": "close"})(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        await self.app(scope, limited, send)


def install(app: FastAPI, max_body_bytes: int) -> None:
    """Every error of `app` as a problem body; bodies over `max_body_bytes` refused with 413."""
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(ServiceError, service_error)
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    app.add_middleware(RequestContext)  # added last: the outermost of the two
