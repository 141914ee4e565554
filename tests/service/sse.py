"""Parsing a Server-Sent Events body in tests (independent of the client's parser)."""

from __future__ import annotations

import json
from typing import Any


def read_events(body: str) -> list[dict[str, Any]]:
    """Each event as {"id", "event", "data"}; comment lines become {"comment": text}."""
    events: list[dict[str, Any]] = []
    for block in body.split("\n\n"):
        if not block.strip():
            continue
        if block.startswith(":"):
            events.append({"comment": block[1:].strip()})
            continue
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in fields:
            event_id = int(fields["id"]) if "id" in fields else None
            events.append({"id": event_id, "event": fields.get("event", "message"), "data": json.loads(fields["data"])})
    return events
