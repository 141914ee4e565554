"""A soak's history: what it did and what it saw, one typed record a line (JSON lines), read back the same way.

    Request      every HTTP call the soak made (user actions, bad requests, reads): status and latency
    Submitted    a job the service accepted, and its kind (custom, compression, nas, transformer, ...)
    Fault        a fault the soak caused (a worker SIGKILLed, a rank SIGKILLed, the webhook receiver down, ...)
    Snapshot     the queue and the workers at one moment (from the service's database)
    JobStates    a job's state changes as its event stream stored them, read once the soak has drained
    Telemetry    the (phase, rank, seq) of every telemetry row stored for a job
    Follower     the event ids one SSE follower saw (across its reconnects), and the ids stored for its job
    Deliveries   the webhook deliveries the server logged (state, attempts), and those the receiver answered 2xx
    Leftovers    what outlived the service: processes, listening ports, shared-memory segments, run locks
    Memory       one process's resident memory at one moment
    Segment      the start of one run of `pipebd soak` (a resumed soak appends a segment to the same history)
    SegmentLoad  its end: its wall time and the load other processes put on the machine meanwhile
    Outage       a server (PostgreSQL, Redis) the soak stopped, and when it answered again
    Outputs      a succeeded job's weights compared with those of the same spec run undisturbed afterwards

Only this module turns records into JSON and back: the checkers (invariants.py) read the dataclasses.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

VERSION = 1  # of the line format below (a `type` and the record's fields)


@dataclass(frozen=True)
class Request:
    time: float  # when it was sent (time.time())
    method: str
    path: str
    status: int  # the answer's status; 0: no answer (refused, timed out)
    latency_s: float
    action: str  # submit, cancel, pause, resume, bad_request, read, follow, ...
    job_id: int | None = None
    state_after: str | None = None  # the job's state in the answer (cancel, pause, resume)

    @property
    def answered_at(self) -> float:
        return self.time + self.latency_s

    @property
    def accepted(self) -> bool:
        return 200 <= self.status < 300


@dataclass(frozen=True)
class Submitted:
    time: float
    job_id: int
    kind: str


@dataclass(frozen=True)
class Fault:
    time: float
    kind: str  # worker_sigkill, worker_sigterm, rank_sigkill, webhook_down, bad_request, ...
    target: str = ""


@dataclass(frozen=True)
class QueuedJob:
    job_id: int
    nproc: int
    nodes: int = 1


@dataclass(frozen=True)
class WorkerLoad:
    name: str
    host: str
    devices: int
    slots: int
    busy: int  # jobs it holds (launched, or seated in a gang)
    alive: bool  # heard from lately


@dataclass(frozen=True)
class Snapshot:
    time: float
    queued: list[QueuedJob] = field(default_factory=list)
    workers: list[WorkerLoad] = field(default_factory=list)


@dataclass(frozen=True)
class StateChange:
    time: float
    state: str


@dataclass(frozen=True)
class JobStates:
    job_id: int
    changes: list[StateChange] = field(default_factory=list)

    @property
    def final(self) -> str | None:
        return self.changes[-1].state if self.changes else None


@dataclass(frozen=True)
class TelemetryRow:
    phase: str
    rank: int
    seq: int


@dataclass(frozen=True)
class Telemetry:
    job_id: int
    rows: list[TelemetryRow] = field(default_factory=list)


@dataclass(frozen=True)
class Follower:
    name: str
    job_id: int
    seen: list[int] = field(default_factory=list)  # the ids of the events it was sent, in order, over reconnects
    stored: list[int] = field(default_factory=list)  # the job's event ids as the database holds them at the end
    reconnects: int = 0


@dataclass(frozen=True)
class Delivery:
    delivery_id: int
    event: str
    state: str  # pending | succeeded | failed, as the server's delivery log has it
    attempts: int = 0  # the server's tries (the first and its retries); 0 in a history written before the field


@dataclass(frozen=True)
class Deliveries:
    logged: list[Delivery] = field(default_factory=list)
    received: list[int] = field(default_factory=list)  # X-PipeBD-Delivery of every request the receiver answered 2xx


@dataclass(frozen=True)
class Leftovers:
    processes: list[str] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    shared_memory: list[str] = field(default_factory=list)
    locks: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Memory:
    time: float
    process: str  # api, worker-a, ...
    rss_bytes: int
    pid: int = 0  # which start of it (a worker started again is a new process, its memory counted anew)


@dataclass(frozen=True)
class Segment:
    time: float
    index: int  # 0 for the first run, then 1, 2, ... for each --resume
    minutes: float  # of mix in this segment
    seed: int
    folder: str  # the service's data folder (a resumed soak starts the same service again)
    servers_folder: str | None  # PostgreSQL's and Redis's (None: the embedded database and broker)
    hook_id: int  # the soak's webhook, and the port its receiver listens on
    receiver_port: int


@dataclass(frozen=True)
class SegmentLoad:
    time: float
    index: int  # the Segment it ends
    wall_s: float  # from the start of its service to its stop
    other_cores: float  # CPU other processes used on average (the soak's own outside its tree taken out)
    shared: bool  # other_cores above the benchmarks' shared bound
    outside_tree_cpu_s: float  # CPU of the soak's own processes outside its process tree, counted as its own


@dataclass(frozen=True)
class Outage:
    server: str  # postgres, redis
    start: float  # when the soak stopped it
    end: float  # when it answered again


@dataclass(frozen=True)
class Outputs:
    job_id: int
    kind: str
    reference_id: int  # the same spec, submitted again after the drain and run undisturbed
    compared: list[str] = field(default_factory=list)  # the weight files compared (student.pt, ...)
    differing: list[str] = field(default_factory=list)  # "file:tensor: why" for each tensor not within tolerance
    reference_state: str = "succeeded"  # the reference run's final state


Record = (
    Request
    | Submitted
    | Fault
    | Snapshot
    | JobStates
    | Telemetry
    | Follower
    | Deliveries
    | Leftovers
    | Memory
    | Segment
    | SegmentLoad
    | Outage
    | Outputs
)
RECORD_TYPES: dict[str, type[Any]] = {
    cls.__name__: cls
    for cls in (
        Request,
        Submitted,
        Fault,
        Snapshot,
        JobStates,
        Telemetry,
        Follower,
        Deliveries,
        Leftovers,
        Memory,
        Segment,
        SegmentLoad,
        Outage,
        Outputs,
    )
}
NESTED: dict[str, type[Any]] = {
    cls.__name__: cls for cls in (QueuedJob, WorkerLoad, StateChange, TelemetryRow, Delivery)
}


class HistoryError(ValueError):
    """A history line this module cannot read back."""


def to_line(record: Record) -> str:
    return json.dumps({"type": type(record).__name__, "v": VERSION, **dataclasses.asdict(record)})


def _build(cls: type[Any], values: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    arguments = {}
    for name, value in values.items():
        hint = hints.get(name)
        inner = typing.get_args(hint)
        if typing.get_origin(hint) is list and inner and isinstance(inner[0], type) and inner[0] in NESTED.values():
            value = [_build(inner[0], item) for item in value]
        arguments[name] = value
    return cls(**arguments)


def from_line(line: str) -> Record:
    values = json.loads(line)
    kind, version = values.pop("type", None), values.pop("v", None)
    if kind not in RECORD_TYPES or version != VERSION:
        raise HistoryError(
            f"a history line of type {kind!r}, version {version!r}: this soak reads {sorted(RECORD_TYPES)}"
            f" at version {VERSION}"
        )
    record: Record = _build(RECORD_TYPES[kind], values)
    return record


class HistoryWriter:
    """Appends records to a history file as they happen (each line flushed: a soak that dies keeps its past).
    With `resume`, the file's records come first and the new ones follow them."""

    def __init__(self, path: Path, resume: bool = False) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.records: list[Record] = read_history(path) if resume else []
        self.handle: IO[str] = path.open("a" if resume else "w")

    def add(self, record: Record) -> None:
        self.records.append(record)
        self.handle.write(to_line(record) + "\n")
        self.handle.flush()

    def extend(self, records: Iterable[Record]) -> None:
        for record in records:
            self.add(record)

    def close(self) -> None:
        self.handle.close()


def read_history(path: Path) -> list[Record]:
    return list(_lines(path))


def _lines(path: Path) -> Iterator[Record]:
    with path.open() as handle:
        for line in handle:
            if line.strip():
                yield from_line(line)
