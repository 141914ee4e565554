"""A small HTTP client of the API for the commands that talk to a server (`pipebd submit`, `sweep`, `jobs`,
`show`, `cancel`, `pause`, `resume`, `logs`, `download`): one request with its refusal turned into one line
(`ClientError`, an unreachable server included), a job's event stream, a file streamed to disk.

The stream is resumed with `Last-Event-ID` when the connection drops, so a follower sees every event
exactly once; it ends at the server's `end` event.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from app.cli.responses import EventJson, JobJson, PageJson, ProblemJson, SweepBody, SweepJson
from app.core.json_types import JsonObject
from pipebd_core.documents.phases import DISTILL
from pipebd_core.documents.telemetry import DistillLine, FinetuneLine, TelemetryLine, parse_line

RECONNECT_S = 1.0
MAX_RECONNECTS = 30
QUIET_PRINT_S = 5.0  # without a terminal, print progress this often (and at every state change)
Query = str | int | float | bool | None  # a query parameter's value (None: left out)


class ClientError(RuntimeError):
    """The server refused the request (the message carries its status and problem: each bad field, or the
    detail), or could not be reached (`status` None)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Event:
    name: str
    data: EventJson
    id: int | None = None


@dataclass
class Follower:
    """Folds events into a one-line progress display."""

    job_id: int
    state: str = "queued"
    phase: str = ""
    progress: float = 0.0
    samples_per_s: float = 0.0
    losses: dict[str, float] = field(default_factory=dict)

    def add(self, event: Event) -> None:
        if event.name == "state":
            self.state = event.data["state"]
        elif event.name == "phase":
            self.phase = event.data["phase"]
            self.progress = event.data.get("progress", self.progress)
        elif event.name == "metrics":
            self.progress = event.data.get("progress", self.progress)
            self.samples_per_s = event.data.get("samples_per_s") or 0.0
            for record in event.data.get("records", []):
                self.add_loss(parse_line(event.data.get("phase", DISTILL), record))

    def add_loss(self, line: TelemetryLine) -> None:
        """The latest loss per block (distillation), or of the whole network (finetune)."""
        if isinstance(line, DistillLine):
            self.losses.update({str(block): loss for block, loss in line.loss.items()})
        elif isinstance(line, FinetuneLine) and line.loss is not None:
            self.losses["network"] = line.loss

    def line(self) -> str:
        width = 30
        filled = int(width * min(1.0, self.progress))
        # no loss before the first step's telemetry: a dash, never `nan`
        loss = f"{sum(self.losses.values()) / len(self.losses):.4g}" if self.losses else "-"
        bar = "#" * filled + "." * (width - filled)
        speed = f"{self.samples_per_s:.1f} samples/s"
        return f"job {self.job_id} [{bar}] {self.progress:6.1%} {self.state:<10} {self.phase:<8} loss {loss} {speed}"


def headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def problem_text(problem: ProblemJson) -> str:
    """The API's problem body in lines: `field: message` for each bad field, else its detail."""
    lines = []
    for item in problem.get("errors") or []:
        loc = [str(part) for part in item.get("loc", [])]
        lines.append(f"{'.'.join(loc[1:]) or ''.join(loc[:1])}: {item.get('message', '')}")
    return "\n".join(lines) or str(problem.get("detail", ""))


def raise_for(response: httpx.Response) -> None:
    if response.is_success:
        return
    response.read()  # a refused event stream is read to its end: a problem body
    try:
        text = problem_text(response.json())
    except ValueError:
        text = response.text
    if response.status_code == 401:
        text += " (give a token with --token or PIPEBD_TOKEN)"
    raise ClientError(f"HTTP {response.status_code}: {text}", response.status_code)


def unreachable(server: str, error: httpx.TransportError) -> ClientError:
    return ClientError(
        f"cannot reach the server at {server} ({type(error).__name__}: {error or 'no answer'}); is it running"
        " (`pipebd up`), and is --server or PIPEBD_SERVER its URL?"
    )


def call(method: str, server: str, token: str | None, path: str, **options: Any) -> httpx.Response:
    """One request to `server` + `path`; ClientError for a refusal or an unreachable server."""
    extra, timeout = options.pop("headers", {}), options.pop("timeout", 60)
    try:
        response = httpx.request(
            method, f"{server}{path}", headers={**headers(token), **extra}, timeout=timeout, **options
        )
    except httpx.TransportError as error:
        raise unreachable(server, error) from None
    raise_for(response)
    return response


def get_json(server: str, token: str | None, path: str, params: Mapping[str, Query] | None = None) -> Any:
    """GET `path` (query `params`, None values left out): its JSON body."""
    query = {key: value for key, value in (params or {}).items() if value is not None}
    return call("GET", server, token, path, params=query).json()


def get_text(server: str, token: str | None, path: str) -> str:
    """GET `path`: its text body."""
    return call("GET", server, token, path).text


def submit(server: str, token: str | None, document: JsonObject, key: str | None = None) -> JobJson:
    extra = {"Idempotency-Key": key} if key else {}
    job: JobJson = call("POST", server, token, "/api/v1/jobs", json=document, headers=extra).json()
    return job


def create_sweep(server: str, token: str | None, body: SweepBody) -> SweepJson:
    """POST /api/v1/sweeps (every child's spec is checked: allow it time); the sweep with its children."""
    sweep: SweepJson = call("POST", server, token, "/api/v1/sweeps", json=body, timeout=120).json()
    return sweep


def act(server: str, token: str | None, job_id: int, action: str) -> JobJson:
    """POST /api/v1/jobs/{id}/{action} (pause, resume or cancel); the job as the server then shows it."""
    job: JobJson = call("POST", server, token, f"/api/v1/jobs/{job_id}/{action}").json()
    return job


def download(server: str, token: str | None, path: str, target: Path) -> int:
    """Stream GET `path` into `target` (written whole or not at all, through `target`.part); its size."""
    part = target.with_name(target.name + ".part")
    try:
        with httpx.stream("GET", f"{server}{path}", headers=headers(token), timeout=60) as response:
            raise_for(response)
            with part.open("wb") as handle:
                for data in response.iter_bytes():
                    handle.write(data)
        part.replace(target)
    except httpx.TransportError as error:
        raise unreachable(server, error) from None
    finally:
        part.unlink(missing_ok=True)
    return target.stat().st_size


def parse_events(lines: Iterator[str]) -> Iterator[Event]:
    """SSE framing: fields until a blank line; comments (keep-alives) are skipped."""
    name, data, event_id = "message", "", None
    for line in lines:
        if not line:
            if data:
                yield Event(name, json.loads(data), event_id)
            name, data, event_id = "message", "", None
        elif line.startswith(":"):
            continue
        else:
            key, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if key == "event":
                name = value
            elif key == "data":
                data += value
            elif key == "id":
                event_id = int(value)


def events(server: str, token: str | None, job_id: int) -> Iterator[Event]:
    """Every event of the job until `end`, reconnecting with Last-Event-ID after a dropped connection."""
    last_id: int | None = None
    for _ in range(MAX_RECONNECTS):
        resume = {"Last-Event-ID": str(last_id)} if last_id is not None else {}
        try:
            url = f"{server}/api/v1/jobs/{job_id}/events"
            with httpx.stream(
                "GET", url, headers={**headers(token), **resume}, timeout=httpx.Timeout(10, read=60)
            ) as response:
                raise_for(response)
                for event in parse_events(response.iter_lines()):
                    if event.id is not None:
                        last_id = event.id
                    yield event
                    if event.name == "end":
                        return
        except (httpx.TransportError, httpx.StreamError):
            time.sleep(RECONNECT_S)
    raise ClientError(f"lost the event stream of job {job_id} {MAX_RECONNECTS} times; giving up")


def follow(server: str, token: str | None, job_id: int) -> str:
    """Draw progress until the job ends; returns its final state."""
    follower = Follower(job_id)
    interactive = sys.stderr.isatty()
    final, printed = "unknown", 0.0
    for event in events(server, token, job_id):
        follower.add(event)
        if event.name == "end":
            final = event.data["state"]
            continue
        due = interactive or event.name in ("state", "phase") or time.time() - printed >= QUIET_PRINT_S
        if event.name in ("state", "phase", "metrics") and due:
            print(follower.line(), end="\r" if interactive else "\n", file=sys.stderr, flush=True)
            printed = time.time()
    print(file=sys.stderr)
    return final


def paged(
    server: str, token: str | None, path: str, query: Mapping[str, Query], cursor: str | None, every: bool
) -> tuple[list[Any], str | None]:
    """The items of a cursor-paged list at `path`: the page at `cursor`, then (`every`: --all) each next
    one; with the cursor of the page after the last one read (None at the end)."""
    items: list[Any] = []
    while True:
        page: PageJson[Any] = get_json(server, token, path, {**query, "cursor": cursor})
        items += page["data"]
        cursor = page["next_cursor"]
        if not every or cursor is None:
            return items, cursor
