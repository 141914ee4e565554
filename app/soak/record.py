"""A soak's result document (pipebd_core/documents/soak_record.py SoakRecord): what ran, what was done to it, how
fast the API answered, how much memory its processes held at the start and the end, each invariant's verdict, the
user actions, and what it ran on and under (the machine, each segment's wall time and load). Built from the
history alone (plus the jobs' final states and the machine), written as JSON."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from app.core.states import FINAL
from app.soak.history import Deliveries, Fault, Follower, Memory, Record, Request, Segment, SegmentLoad, Submitted
from app.soak.invariants import Verdict, of_type
from pipebd_core.documents.bench_record import Load, Machine
from pipebd_core.documents.soak_record import (
    FollowerCounts,
    InvariantOutcome,
    JobCounts,
    MemoryFigures,
    SoakRecord,
    SoakSegment,
    WebhookCounts,
)

PERCENTILES = (50, 90, 99)
STREAMING = frozenset({"follow"})  # requests whose latency is a stream's life, not an answer's
USER_ACTIONS = ("cancel", "pause", "resume", "priority", "bad_request", "read")  # the driver's, beside submissions


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def latency_ms(records: Sequence[Record]) -> dict[str, float]:
    answered = [r.latency_s * 1000 for r in of_type(records, Request) if r.status and r.action not in STREAMING]
    figures = {f"p{q}": round(percentile(answered, q), 1) for q in PERCENTILES}
    figures["max"] = round(max(answered, default=0.0), 1)
    return figures


def memory_figures(records: Sequence[Record]) -> MemoryFigures:
    first: dict[str, Memory] = {}
    last: dict[str, Memory] = {}
    for sample in sorted(of_type(records, Memory), key=lambda s: s.time):
        first.setdefault(sample.process, sample)
        last[sample.process] = sample
    mib = 1 << 20
    return MemoryFigures(
        start={name: round(s.rss_bytes / mib, 1) for name, s in sorted(first.items())},
        end={name: round(s.rss_bytes / mib, 1) for name, s in sorted(last.items())},
    )


def action_counts(records: Sequence[Record]) -> dict[str, int]:
    """Requests made per user action (the driver's draws; a bad request's answer is no_5xx's business)."""
    counts = Counter(r.action for r in of_type(records, Request) if r.action in USER_ACTIONS)
    return {action: counts[action] for action in USER_ACTIONS}


def follower_counts(records: Sequence[Record]) -> FollowerCounts:
    """Every segment's followers (a follower is one segment's: a resume starts new ones)."""
    followers = of_type(records, Follower)
    return FollowerCounts(
        followers=len(followers),
        reconnects=sum(f.reconnects for f in followers),
        events=sum(len(f.seen) for f in followers),
    )


def webhook_counts(records: Sequence[Record]) -> WebhookCounts:
    """The last segment's delivery log (the server keeps every segment's), and what the receiver answered in each."""
    segments = of_type(records, Deliveries)
    logged = segments[-1].logged if segments else []
    states = Counter(d.state for d in logged)
    return WebhookCounts(
        deliveries=len(logged),
        succeeded=states["succeeded"],
        failed=states["failed"],
        retries=sum(max(0, d.attempts - 1) for d in logged),
        received=sum(len(segment.received) for segment in segments),
    )


def segments(records: Sequence[Record]) -> list[SoakSegment]:
    """Every segment of the history, with its end's wall time and load where it recorded them."""
    ends = {end.index: end for end in of_type(records, SegmentLoad)}
    return [segment_of(segment, ends.get(segment.index)) for segment in of_type(records, Segment)]


def segment_of(segment: Segment, end: SegmentLoad | None) -> SoakSegment:
    if end is None:
        return SoakSegment(index=segment.index, minutes=segment.minutes, wall_s=None, load=None)
    load = Load(wall_s=end.wall_s, other_cores=end.other_cores, shared=end.shared)
    return SoakSegment(
        index=segment.index,
        minutes=segment.minutes,
        wall_s=end.wall_s,
        load=load,
        outside_tree_cpu_s=end.outside_tree_cpu_s,
    )


def build_record(
    seed: int,
    minutes: float,
    records: Sequence[Record],
    final_states: dict[int, str],
    verdicts: dict[str, Verdict],
    machine: Machine | None = None,
    commit: str | None = None,
) -> SoakRecord:
    submitted = of_type(records, Submitted)
    return SoakRecord(
        seed=seed,
        minutes=minutes,
        jobs=JobCounts(
            submitted=dict(sorted(Counter(s.kind for s in submitted).items())),
            finished=dict(sorted(Counter(s.kind for s in submitted if final_states.get(s.job_id) in FINAL).items())),
        ),
        faults=dict(sorted(Counter(f.kind for f in of_type(records, Fault)).items())),
        api_latency_ms=latency_ms(records),
        memory=memory_figures(records),
        invariants={name: InvariantOutcome(held=v.held, detail=v.detail) for name, v in verdicts.items()},
        commit=commit,
        machine=machine,
        actions=action_counts(records),
        followers=follower_counts(records),
        webhooks=webhook_counts(records),
        segments=segments(records),
    )


def write_record(path: Path, record: SoakRecord) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record.to_json(), indent=2) + "\n")
