"""Bearer-token authentication with two scopes: `read` (look) and `submit` (look, submit, cancel, delete).

With `PIPEBD_API_TOKENS` unset the API is open, and the server refuses to listen beyond loopback
unless told `--insecure` (see `check_bind`). The dashboard may send the token as the `pipebd_token`
cookie instead of a header (browsers cannot add headers to EventSource requests).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Callable

from fastapi import Request

from app.core.settings import Scope, Settings
from app.services.errors import ServiceError

COOKIE = "pipebd_token"
SCOPE_RANK = {"read": 0, "submit": 1}


def presented_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.cookies.get(COOKIE)


def scope_of(token: str, tokens: dict[str, Scope]) -> Scope | None:
    found: Scope | None = None
    for known, scope in tokens.items():
        if hmac.compare_digest(known.encode(), token.encode()):
            found = scope
    return found


def authorize(request: Request, settings: Settings, needed: Scope) -> None:
    """Raise 401 (no or unknown token) or 403 (token without the needed scope); no-op without tokens."""
    tokens = settings.tokens
    if not tokens:
        return
    token = presented_token(request)
    challenge = {"WWW-Authenticate": "Bearer"}
    if token is None:
        detail = "missing bearer token: this server needs `Authorization: Bearer <token>` (PIPEBD_API_TOKENS is set)"
        raise ServiceError(401, detail, headers=challenge)
    scope = scope_of(token, tokens)
    if scope is None:
        raise ServiceError(401, "unknown bearer token", headers=challenge)
    if SCOPE_RANK[scope] < SCOPE_RANK[needed]:
        detail = f"this token has the {scope!r} scope; this request needs a {needed!r} token"
        raise ServiceError(403, detail)


def require(needed: Scope) -> Callable[[Request], None]:
    """A route dependency checking the request's token against the app's settings."""

    def dependency(request: Request) -> None:
        authorize(request, request.app.state.settings, needed)

    return dependency


def fingerprint(token: str) -> str:
    """A token's stable name that reveals nothing of it: who submitted a job (`Job.tenant`), whose limit."""
    return hashlib.sha256(token.encode()).hexdigest()[:32]


def tenant_of(request: Request, settings: Settings) -> str | None:
    """The presented token's fingerprint; None when the server has no tokens (every client is the same)."""
    token = presented_token(request) if settings.tokens else None
    return None if token is None else fingerprint(token)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, settings: Settings, insecure: bool) -> None:
    """Refuse to serve an open API beyond this machine; raises ValueError saying what would work."""
    if settings.tokens or insecure or is_loopback(host):
        return
    raise ValueError(
        f"refusing to listen on {host} without authentication: set PIPEBD_API_TOKENS"
        " ('TOKEN=submit,TOKEN2=read'), listen on 127.0.0.1, or pass --insecure to serve an open API"
    )
