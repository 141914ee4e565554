"""A soak's result document: what ran, what was done to it, how fast the API answered, how much memory its
processes held at the start and the end, and each invariant's verdict. Built from the history alone (plus
the jobs' final states), written as JSON."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

from app.core.states import FINAL
from app.soak.history import Fault, Memory, Record, Request, Submitted
from app.soak.invariants import Verdict, of_type

PERCENTILES = (50, 90, 99)
STREAMING = frozenset({"follow"})  # requests whose latency is a stream's life, not an answer's


class JobCounts(TypedDict):
    submitted: dict[str, int]  # kind -> jobs submitted
    finished: dict[str, int]  # kind -> jobs that ended (succeeded, failed or cancelled) by the soak's end


class InvariantOutcome(TypedDict):
    held: bool
    detail: str | None  # the first violation


class MemoryFigures(TypedDict):
    start: dict[str, float]  # process -> resident MiB at its first sample
    end: dict[str, float]  # and at its last


class SoakRecord(TypedDict):
    seed: int
    minutes: float
    jobs: JobCounts
    faults: dict[str, int]
    api_latency_ms: dict[str, float]  # p50, p90, p99, max over every answered request (streams excepted)
    memory: MemoryFigures
    invariants: dict[str, InvariantOutcome]


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
    return {
        "start": {name: round(s.rss_bytes / mib, 1) for name, s in sorted(first.items())},
        "end": {name: round(s.rss_bytes / mib, 1) for name, s in sorted(last.items())},
    }


def build_record(
    seed: int, minutes: float, records: Sequence[Record], final_states: dict[int, str], verdicts: dict[str, Verdict]
) -> SoakRecord:
    submitted = of_type(records, Submitted)
    return {
        "seed": seed,
        "minutes": minutes,
        "jobs": {
            "submitted": dict(sorted(Counter(s.kind for s in submitted).items())),
            "finished": dict(sorted(Counter(s.kind for s in submitted if final_states.get(s.job_id) in FINAL).items())),
        },
        "faults": dict(sorted(Counter(f.kind for f in of_type(records, Fault)).items())),
        "api_latency_ms": latency_ms(records),
        "memory": memory_figures(records),
        "invariants": {name: {"held": v.held, "detail": v.detail} for name, v in verdicts.items()},
    }


def write_record(path: Path, record: SoakRecord) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
