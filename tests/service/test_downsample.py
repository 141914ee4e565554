"""Pure logic: bucketing telemetry for charts keeps every bucket's extremes."""

from __future__ import annotations

from app.downsample import bucket_bounds, downsample, to_point


def point(rank: int, seq: int, losses: dict[str, float], peak: int = 0) -> dict:  # type: ignore[type-arg]
    record = {
        "rank": rank,
        "epoch": 0,
        "step": seq,
        "time": float(seq),
        "loss": losses,
        "phases": {"teacher": 1.0},
        "samples": 8,
        "peak_mem": peak,
    }
    return to_point(record, seq)


def test_bucket_bounds_cover_everything_evenly() -> None:
    assert bucket_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert bucket_bounds(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]


def test_short_series_are_returned_unchanged() -> None:
    points = [point(0, i, {"0": float(i)}) for i in range(5)]
    assert downsample(points, 5) == points


def test_spikes_survive_downsampling_per_block_and_rank() -> None:
    losses = [1.0, 9.0, 1.0, 1.0, 1.0, 1.0, -3.0, 1.0, 1.0]
    points = [point(0, i, {"0": value, "1": 2.0}, peak=i) for i, value in enumerate(losses)]
    points += [point(1, i, {"2": 0.5}) for i in range(4)]
    result = downsample(points, 3)
    rank0 = [p for p in result if p["rank"] == 0]
    assert [p["count"] for p in rank0] == [3, 3, 3]
    assert [p["loss_max"]["0"] for p in rank0] == [9.0, 1.0, 1.0]
    assert [p["loss_min"]["0"] for p in rank0] == [1.0, 1.0, -3.0]
    assert rank0[0]["loss"]["0"] == 11.0 / 3 and rank0[0]["loss_min"]["1"] == 2.0
    assert [p["seq"] for p in rank0] == [2, 5, 8] and [p["peak_mem"] for p in rank0] == [2, 5, 8]
    assert [p["count"] for p in result if p["rank"] == 1] == [2, 1, 1]
