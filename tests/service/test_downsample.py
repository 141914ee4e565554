"""Pure logic: bucketing telemetry for charts keeps every bucket's extremes."""

from __future__ import annotations

from app.core.downsample import bucket_bounds, downsample, to_point
from tests.telemetry_lines import distill_line


def point(rank: int, seq: int, losses: dict[int, float], peak: int = 0) -> dict:  # type: ignore[type-arg]
    line = distill_line(rank, seq, loss=losses, phases={"teacher": 1.0}, samples=8, peak_mem=peak, done=seq)
    return to_point(line)


def test_bucket_bounds_cover_everything_evenly() -> None:
    assert bucket_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert bucket_bounds(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]


def test_short_series_are_returned_unchanged() -> None:
    points = [point(0, i, {0: float(i)}) for i in range(5)]
    assert downsample(points, 5) == points


def test_spikes_survive_downsampling_per_block_and_rank() -> None:
    losses = [1.0, 9.0, 1.0, 1.0, 1.0, 1.0, -3.0, 1.0, 1.0]
    points = [point(0, i, {0: value, 1: 2.0}, peak=i) for i, value in enumerate(losses)]
    points += [point(1, i, {2: 0.5}) for i in range(4)]
    result = downsample(points, 3)
    rank0 = [p for p in result if p["rank"] == 0]
    assert [p["count"] for p in rank0] == [3, 3, 3]
    assert [p["loss_max"]["0"] for p in rank0] == [9.0, 1.0, 1.0]
    assert [p["loss_min"]["0"] for p in rank0] == [1.0, 1.0, -3.0]
    assert rank0[0]["loss"]["0"] == 11.0 / 3 and rank0[0]["loss_min"]["1"] == 2.0
    assert [p["seq"] for p in rank0] == [2, 5, 8] and [p["peak_mem"] for p in rank0] == [2, 5, 8]
    assert [p["count"] for p in result if p["rank"] == 1] == [2, 1, 1]


def test_current_memory_keeps_each_buckets_highest_and_gpu_utilization_its_mean() -> None:
    def gpu_point(seq: int, current: int, util: int | None) -> dict:  # type: ignore[type-arg]
        return to_point(distill_line(0, seq, peak_mem=20, cur_mem=current, gpu_util=util, done=seq))

    lines = [(5, 10), (9, 30), (4, None), (3, 50), (2, 70), (1, 90), (2, 80)]
    first, second = downsample([gpu_point(seq, c, u) for seq, (c, u) in enumerate(lines, start=1)], 2)
    assert (first["count"], second["count"]) == (4, 3)
    assert (first["cur_mem"], second["cur_mem"]) == (9, 2) and first["peak_mem"] == 20
    assert first["gpu_util"] == 30.0 and second["gpu_util"] == 80.0  # the line without one does not count
    merged = downsample([first, second], 1)[0]  # rollups of rollups: weighted by the lines they stand for
    assert merged["cur_mem"] == 9 and merged["gpu_util"] == (30.0 * 4 + 80.0 * 3) / 7
    old = [{**point(0, i, {0: 1.0}), "cur_mem": None} for i in range(4)]  # rollups from before cur_mem was kept
    cpu = downsample(old, 2)
    assert [(p["cur_mem"], p["gpu_util"]) for p in cpu] == [(None, None), (None, None)]
