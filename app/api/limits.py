"""Submissions per client per minute: a sliding window per token (per client address without tokens),
kept in the database (app/core/limits.py), so every API process behind it counts the same submissions.

Every POST /api/v1/jobs that passed authentication is counted, refused ones included: checking a spec
costs the server too. Past `per_minute` in the last 60 s the request gets 429 with `Retry-After`, the
seconds until the oldest counted submission leaves the window.
"""

from __future__ import annotations

import math
import time

from fastapi import Request
from sqlmodel import Session

from app.api.auth import fingerprint, presented_token
from app.core.database import get_engine
from app.core.limits import forget_quiet, rate_name, take

WINDOW_S = 60.0


def client_key(request: Request, tokens_configured: bool) -> str:
    """Who is submitting: the token (hashed: never stored as it came) or the client's address."""
    token = presented_token(request) if tokens_configured else None
    if token is not None:
        return "token:" + fingerprint(token)
    return "address:" + (request.client.host if request.client else "unknown")


def count_submission(database: str, client: str, per_minute: int) -> float | None:
    """Count a submission by `client`; None when admitted, else the seconds to wait. One transaction."""
    at = time.time()
    with Session(get_engine(database)) as session:
        forget_quiet(session, at - WINDOW_S)
        wait_s = take(session, rate_name(client), limit=per_minute, window_s=WINDOW_S, at=at)
        session.commit()
    return wait_s


def retry_after(wait_s: float) -> str:
    """The `Retry-After` value: whole seconds, at least 1."""
    return str(max(1, math.ceil(wait_s)))
