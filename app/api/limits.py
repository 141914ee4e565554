"""Submissions per client per minute: a sliding window per token (per client address without tokens),
kept in the database (app/core/limits.py: count_submission), so every API process behind it counts the same
submissions. This module names the client of a request (`client_key`); app/services/submissions.py counts.

Every POST /api/v1/jobs that passed authentication is counted, refused ones included: checking a spec
costs the server too. Past `per_minute` in the last 60 s the request gets 429 with `Retry-After`, the
seconds until the oldest counted submission leaves the window.
"""

from __future__ import annotations

from fastapi import Request

from app.api.auth import fingerprint, presented_token


def client_key(request: Request, tokens_configured: bool) -> str:
    """Who is submitting: the token (hashed: never stored as it came) or the client's address."""
    token = presented_token(request) if tokens_configured else None
    if token is not None:
        return "token:" + fingerprint(token)
    return "address:" + (request.client.host if request.client else "unknown")
