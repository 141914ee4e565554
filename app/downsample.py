"""Server-side downsampling of telemetry for charts: at most `max_points` per rank, peaks kept.

The points of one rank are cut into `max_points` consecutive buckets. A bucket becomes one point:
the last line's position (seq, epoch, step, time), the mean loss of each block, and, so that no spike
disappears from a chart, each block's minimum and maximum loss over the bucket (`loss_min`,
`loss_max`); phase times are averaged, peak memory is the bucket's maximum. Undownsampled points
have `count` 1 and min = max = the loss.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

Point = dict[str, Any]


def to_point(record: dict[str, Any], seq: int) -> Point:
    """One telemetry line as a chart point."""
    loss = {str(block): float(value) for block, value in record.get("loss", {}).items()}
    return {
        "rank": record["rank"],
        "seq": seq,
        "epoch": record.get("epoch"),
        "step": record.get("step"),
        "time": record.get("time"),
        "blocks": record.get("blocks", []),
        "loss": loss,
        "loss_min": dict(loss),
        "loss_max": dict(loss),
        "phases": dict(record.get("phases", {})),
        "samples": record.get("samples"),
        "peak_mem": record.get("peak_mem"),
        "count": 1,
    }


def bucket_bounds(length: int, buckets: int) -> list[tuple[int, int]]:
    """`buckets` consecutive [start, stop) ranges covering `length` items, sizes differing by at most one."""
    base, extra = divmod(length, buckets)
    bounds, start = [], 0
    for index in range(buckets):
        stop = start + base + (1 if index < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def merge(points: list[Point]) -> Point:
    """One point standing for a bucket of consecutive points of one rank."""
    last = points[-1]
    losses: dict[str, list[float]] = defaultdict(list)
    for point in points:
        for block, value in point["loss"].items():
            losses[block].append(value)
    phases: dict[str, list[float]] = defaultdict(list)
    for point in points:
        for phase, value in point["phases"].items():
            phases[phase].append(value)
    memory = [point["peak_mem"] for point in points if point["peak_mem"] is not None]
    samples = [point["samples"] for point in points if point["samples"] is not None]
    return {
        **last,
        "loss": {block: sum(values) / len(values) for block, values in losses.items()},
        "loss_min": {block: min(values) for block, values in losses.items()},
        "loss_max": {block: max(values) for block, values in losses.items()},
        "phases": {phase: sum(values) / len(values) for phase, values in phases.items()},
        "samples": sum(samples) / len(samples) if samples else None,
        "peak_mem": max(memory) if memory else None,
        "count": sum(point["count"] for point in points),
    }


def downsample(points: list[Point], max_points: int) -> list[Point]:
    """At most `max_points` points per rank, in the input order within each rank (ranks in ascending order)."""
    by_rank: dict[int, list[Point]] = defaultdict(list)
    for point in points:
        by_rank[point["rank"]].append(point)
    result: list[Point] = []
    for rank in sorted(by_rank):
        series = by_rank[rank]
        if len(series) <= max_points:
            result.extend(series)
            continue
        result.extend(merge(series[start:stop]) for start, stop in bucket_bounds(len(series), max_points))
    return result
