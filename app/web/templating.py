"""Jinja2 templates for the dashboard (`templates/` at the repository root) and their filters.

`render(request, name, context)` adds what every page needs: the viewer (token scope) and whether
tokens are configured.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "templates"
STATIC = Path(__file__).resolve().parents[1] / "static"

templates = Jinja2Templates(directory=str(TEMPLATES))


def duration(seconds: float | None) -> str:
    """`42.0 s`, `3 min 05 s`, `2 h 07 min`; an em dash for nothing."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def size(value: float | None) -> str:
    """Bytes in binary units: `512 B`, `1.5 MiB`, `2.00 GiB`."""
    if value is None:
        return "—"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.2f} {unit}" if unit == "GiB" else f"{value / scale:.1f} {unit}"
    return f"{int(value)} B"


def percent(fraction: float | None, digits: int = 0) -> str:
    return "—" if fraction is None else f"{100 * fraction:.{digits}f}%"


def rate(value: float | None) -> str:
    """Samples per second with sensible precision."""
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def millis(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    value = seconds * 1000
    return f"{value:.0f} ms" if value >= 100 else f"{value:.2f} ms"


def clock(timestamp: float | None) -> str:
    if timestamp is None:
        return "—"
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def iso(timestamp: float | None) -> str:
    return "" if timestamp is None else datetime.fromtimestamp(timestamp, UTC).isoformat()


def blocks(indices: list[int] | range | None) -> str:
    """`0`, `1–3`, `0, 2, 5` for a list of block indices."""
    values = sorted(indices or [])
    if not values:
        return "none"
    if values == list(range(values[0], values[-1] + 1)) and len(values) > 1:
        return f"{values[0]}–{values[-1]}"
    return ", ".join(str(value) for value in values)


for _name, _filter in {
    "duration": duration,
    "size": size,
    "percent": percent,
    "rate": rate,
    "millis": millis,
    "clock": clock,
    "iso": iso,
    "blocks": blocks,
}.items():
    templates.env.filters[_name] = _filter


def render(request: Request, name: str, context: dict[str, Any], status_code: int = 200) -> HTMLResponse:
    viewer = getattr(request.state, "viewer", None)
    base = {
        "viewer": viewer,
        "auth": bool(request.app.state.settings.tokens),
        "can_submit": viewer is not None and viewer.can_submit,
    }
    return templates.TemplateResponse(request, name, {**base, **context}, status_code=status_code)
