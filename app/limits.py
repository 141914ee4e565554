"""Submissions per client per minute: a sliding window per token (per client address without tokens).

Each API process counts its own submissions (every POST /api/v1/jobs that passed authentication,
refused ones included: checking a spec costs the server too). Past `per_minute` in the last 60 s the
request gets 429 with `Retry-After`, the seconds until the oldest counted submission leaves the window.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections import deque

from fastapi import Request

from app.auth import presented_token

WINDOW_S = 60.0


def client_key(request: Request, tokens_configured: bool) -> str:
    """Who is submitting: the token (hashed: never kept in memory as it came) or the client's address."""
    token = presented_token(request) if tokens_configured else None
    if token is not None:
        return "token:" + hashlib.sha256(token.encode()).hexdigest()[:32]
    return "address:" + (request.client.host if request.client else "unknown")


class SubmissionLimiter:
    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self.lock = threading.Lock()
        self.seen: dict[str, deque[float]] = {}

    def admit(self, key: str) -> float | None:
        """Count a submission by `key`; None when admitted, else the seconds to wait."""
        now = time.monotonic()
        with self.lock:
            for other in [k for k, times in self.seen.items() if times[-1] <= now - WINDOW_S]:
                del self.seen[other]  # forget clients quiet for a whole window
            times = self.seen.setdefault(key, deque())
            while times and times[0] <= now - WINDOW_S:
                times.popleft()
            if len(times) >= self.per_minute:
                return times[0] + WINDOW_S - now
            times.append(now)
            return None


def retry_after(wait_s: float) -> str:
    """The `Retry-After` value: whole seconds, at least 1."""
    return str(max(1, math.ceil(wait_s)))
