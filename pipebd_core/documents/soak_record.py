"""The soak's result document (`pipebd soak --out FILE`, built by app/soak/record.py, shown on docs/reliability.md
by pipebd_core/bench/soak_page.py): what ran, what was done to it, how fast the API answered, how much memory its
processes held at the start and the end, each invariant's verdict, and what it ran on and under.

The issue's fields (seed, minutes, jobs, faults, api_latency_ms, memory, invariants) are always there; the later
ones (commit, machine, actions, followers, webhooks, segments) are None in a record written before them: the page
says "not recorded".
"""

from __future__ import annotations

from typing import Literal

from pipebd_core.documents.bench_record import Load, Machine
from pipebd_core.documents.parts import Part


class JobCounts(Part):
    submitted: dict[str, int]  # kind -> jobs submitted
    finished: dict[str, int]  # kind -> jobs that ended (succeeded, failed or cancelled) by the soak's end


class InvariantOutcome(Part):
    held: bool
    detail: str | None  # the first violation


class MemoryFigures(Part):
    start: dict[str, float]  # process -> resident MiB at its first sample
    end: dict[str, float]  # and at its last


class FollowerCounts(Part):
    """The SSE followers the soak ran: each hangs up after a few events and reconnects with Last-Event-ID."""

    followers: int
    reconnects: int  # connections after each follower's first, each from the last event it saw
    events: int  # events they were sent, over every connection


class WebhookCounts(Part):
    """The soak's webhook, as the server's delivery log has it at the end and as its receiver saw it."""

    deliveries: int  # events logged for it
    succeeded: int
    failed: int  # given up after their retries
    retries: int  # the server's attempts after each delivery's first
    received: int  # requests the soak's receiver answered 2xx, over every segment


class SoakSegment(Part):
    """One run of `pipebd soak` (the first, or a --resume): its mix, its wall time from the start of its service to
    its stop, and the load other processes put on the machine meanwhile."""

    index: int
    minutes: float  # of mix
    wall_s: float | None  # None: the segment did not record its end (it was stopped, or predates the field)
    load: Load | None
    # CPU seconds of the soak's own processes outside its process tree (its PostgreSQL and Redis, ranks orphaned
    # by its SIGKILLs), counted as its own: taken out of `load.other_cores`
    outside_tree_cpu_s: float | None = None


class SoakRecord(Part):
    benchmark: Literal["soak"] = "soak"
    seed: int
    minutes: float
    jobs: JobCounts
    faults: dict[str, int]
    api_latency_ms: dict[str, float]  # p50, p90, p99, max over every answered request (streams excepted)
    memory: MemoryFigures
    invariants: dict[str, InvariantOutcome]
    commit: str | None = None
    machine: Machine | None = None  # of the last segment
    actions: dict[str, int] | None = None  # user action -> requests made (cancel, pause, resume, ...)
    followers: FollowerCounts | None = None
    webhooks: WebhookCounts | None = None
    segments: list[SoakSegment] | None = None

    @property
    def shared(self) -> bool:
        """Some segment ran while other processes used more than the shared bound."""
        return any(segment.load is not None and segment.load.shared for segment in self.segments or [])
