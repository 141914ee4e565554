"""What the commands that talk to a server print: the server's JSON as it came (`--json`), or compact
tables and `key  value` lines for a person."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2), flush=True)


def cell(value: Any) -> str:
    """A value as a table shows it: times to the second, fractions as percentages, nothing as `-`."""
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    text = str(value)
    if len(text) >= 19 and text[10] == "T" and text.endswith("Z"):  # the API's ISO 8601 times, UTC
        return text[:19].replace("T", " ")
    return text


def percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:.0%}"


def millis(seconds: float | None) -> str | None:
    """A measured step as `5.79 ms`; None (left out) without one."""
    return None if seconds is None else f"{seconds * 1e3:.2f} ms"


def share(fraction: float | None) -> str | None:
    """A share as `77%`; None (left out) without one."""
    return None if fraction is None else percent(fraction)


def mebibytes(size: int | None) -> str | None:
    """Bytes as `12.3 MiB`; None (left out) without a size."""
    return None if size is None else f"{size / 2**20:.1f} MiB"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to their widest cell, two spaces apart, headers in capitals."""
    cells = [[header.upper() for header in headers], *([cell(value) for value in row] for row in rows)]
    widths = [max(len(line[column]) for line in cells) for column in range(len(headers))]
    return "\n".join(
        "  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip() for line in cells
    )


def fields(pairs: Sequence[tuple[str, Any]]) -> str:
    """`key  value` lines, keys aligned, the pairs without a value left out."""
    shown = [(key, cell(value)) for key, value in pairs if value not in (None, "", [])]
    width = max((len(key) for key, _ in shown), default=0)
    return "\n".join(f"{key.ljust(width)}  {value}" for key, value in shown)
