"""Server-side downsampling of telemetry for charts: at most `max_points` per rank, peaks kept.

The points of one rank are cut into `max_points` consecutive buckets. A bucket becomes one point:
the last line's position (seq, epoch, step, time), the mean loss of each block, and, so that no spike
disappears from a chart, each block's minimum and maximum loss over the bucket (`loss_min`,
`loss_max`); phase times are averaged, peak memory and current memory (`cur_mem`) are the bucket's
maximum, GPU utilisation (`gpu_util`, CUDA ranks only) the mean over the lines that have one.
Undownsampled points have `count` 1 and min = max = the loss. Points that already stand for several
lines (the rollups of app/core/rollups.py) merge the same way, weighted by their `count`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Literal, NotRequired, TypedDict

from pipebd_core.data.streams import even_ranges
from pipebd_core.documents.telemetry import DistillLine, StepLine


class Point(TypedDict):
    """One chart point of one rank (the API's MetricPoint): a telemetry line, or consecutive lines merged.
    Points of rollups stored before `acc`, `cur_mem` or `gpu_util` existed lack them."""

    rank: int
    seq: int
    epoch: int | None
    step: int | None
    time: float | None
    blocks: list[int]
    loss: dict[str, float]
    loss_min: dict[str, float]
    loss_max: dict[str, float]
    phases: dict[str, float]
    acc: NotRequired[float | None]
    samples: float | None
    peak_mem: int | None
    cur_mem: NotRequired[int | None]
    gpu_util: NotRequired[float | None]
    count: int


def to_point(line: StepLine) -> Point:
    """One telemetry line as a chart point: a distillation step's loss per block and phase times, or a
    finetune step's loss (as block "network"), train accuracy and action times."""
    if isinstance(line, DistillLine):
        loss = {str(block): value for block, value in line.loss.items()}
        blocks, phases, acc, gpu_util = line.blocks, line.phases, None, line.gpu_util
    else:  # a pipeline stage that computes no loss reports none
        loss = {"network": line.loss} if line.loss is not None else {}
        blocks, phases, acc, gpu_util = [], line.times, line.acc, None
    return {
        "rank": line.rank,
        "seq": line.seq,
        "epoch": line.epoch,
        "step": line.step,
        "time": line.time,
        "blocks": list(blocks),
        "loss": loss,
        "loss_min": dict(loss),
        "loss_max": dict(loss),
        "phases": dict(phases),
        "acc": acc,
        "samples": line.samples,
        "peak_mem": line.peak_mem,
        "cur_mem": line.cur_mem,
        "gpu_util": gpu_util,
        "count": 1,
    }


def bucket_bounds(length: int, buckets: int) -> list[tuple[int, int]]:
    """`buckets` consecutive [start, stop) ranges covering `length` items, sizes differing by at most one."""
    return even_ranges(length, buckets)


def _weighted_means(points: Sequence[Point], field: Literal["loss", "phases"]) -> dict[str, float]:
    """Per key of `field`, the mean over the lines the points stand for (a point of `count` lines weighs `count`)."""
    sums: dict[str, float] = defaultdict(float)
    weights: dict[str, int] = defaultdict(int)
    for point in points:
        for key, value in point[field].items():
            sums[key] += value * point["count"]
            weights[key] += point["count"]
    return {key: sums[key] / weights[key] for key in sums}


def _mean(weighted: list[tuple[float, int]]) -> float | None:
    """The mean of (value, count) pairs, each value standing for `count` lines; None for no pairs."""
    return sum(v * c for v, c in weighted) / sum(c for _, c in weighted) if weighted else None


def merge(points: Sequence[Point]) -> Point:
    """One point standing for consecutive points of one rank (each may itself stand for several lines)."""
    last = points[-1]
    low: dict[str, float] = {}
    high: dict[str, float] = {}
    for point in points:
        for block in point["loss"]:
            low[block] = min(low.get(block, math.inf), point["loss_min"][block])
            high[block] = max(high.get(block, -math.inf), point["loss_max"][block])
    memory = [peak for point in points if (peak := point["peak_mem"]) is not None]
    current = [mem for point in points if (mem := point.get("cur_mem")) is not None]
    utilization = [(util, point["count"]) for point in points if (util := point.get("gpu_util")) is not None]
    counted = [(rows, point["count"]) for point in points if (rows := point["samples"]) is not None]
    accuracy = [(acc, point["count"]) for point in points if (acc := point.get("acc")) is not None]
    return {
        **last,
        "loss": _weighted_means(points, "loss"),
        "loss_min": low,
        "loss_max": high,
        "phases": _weighted_means(points, "phases"),
        "samples": _mean(counted),
        "peak_mem": max(memory) if memory else None,
        "cur_mem": max(current) if current else None,
        "gpu_util": _mean(utilization),
        "acc": _mean(accuracy),
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
