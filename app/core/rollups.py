"""Rollups of telemetry for the charts of long jobs: each rank's lines merged in runs of 4, 16, 64, ...

A job of 100,000 lines is too much to read, decode and downsample on every page load. As the worker
stores lines it also feeds them to a `RollupBuilder`, which writes a `job_metric_rollup` row each
time a run of `lines` consecutive lines of a rank is complete, at every level (a level's runs are
merged from four runs of the level below). Reading, `chart_points` takes for each rank the finest
level with at most 2 x `max_points` runs (judged from the rank's last `seq`, an index lookup),
merges the raw lines after its last complete run into one more point, and downsamples that to
`max_points` as before: at most 2 x `max_points` rows per rank, whatever the length of the job.
Each run keeps its lines' minimum and maximum loss, so no spike is lost. A rank whose rollups do not
add up (lines stored without them) is downsampled from its raw lines.
"""

from __future__ import annotations

import json
from collections import defaultdict

from sqlalchemy import Text, cast
from sqlmodel import Session, col, func, select

from app.core.downsample import Point, downsample, merge, to_point
from app.core.tables import JobMetric, JobMetricRollup
from pipebd_core.documents.phases import DISTILL
from pipebd_core.documents.telemetry import step_line

FACTOR = 4  # runs of a level merged into one run of the next
LEVELS = tuple(FACTOR ** (power + 1) for power in range(8))  # lines per run: 4, 16, ..., 65536


class Run(Point):
    """A point on its way into a rollup row, with the seq of its first line."""

    first_seq: int


class RollupBuilder:
    """Turns one job's stored lines of one phase, in arrival order, into the rollup rows that became complete."""

    def __init__(self, job_id: int, phase: str = DISTILL) -> None:
        self.job_id, self.phase = job_id, phase
        self.pending: dict[tuple[int, int], list[Run]] = defaultdict(list)  # (rank, level) -> runs below

    def add(self, points: list[Point]) -> list[JobMetricRollup]:
        rows: list[JobMetricRollup] = []
        for point in points:
            self._push(point["rank"], 0, {**point, "first_seq": point["seq"]}, rows)
        return rows

    def _push(self, rank: int, level: int, point: Run, rows: list[JobMetricRollup]) -> None:
        pending = self.pending[(rank, level)]
        pending.append(point)
        if len(pending) < FACTOR:
            return
        run: Run = {**merge(pending), "first_seq": pending[0]["first_seq"]}
        pending.clear()
        rows.append(
            JobMetricRollup(
                job_id=self.job_id,
                phase=self.phase,
                rank=rank,
                lines=LEVELS[level],
                first_seq=run["first_seq"],
                last_seq=run["seq"],
                point={key: value for key, value in run.items() if key != "first_seq"},
            )
        )
        if level + 1 < len(LEVELS):
            self._push(rank, level + 1, run, rows)


def _raw_points(session: Session, job_id: int, phase: str, rank: int, after_seq: int = 0) -> list[Point]:
    query = (
        select(JobMetric.record)
        .where(JobMetric.job_id == job_id, JobMetric.phase == phase, JobMetric.rank == rank, JobMetric.seq > after_seq)
        .order_by(col(JobMetric.seq))
    )
    return [to_point(step_line(phase, record)) for record in session.exec(query).all()]


def _from_rollups(
    session: Session, job_id: int, phase: str, rank: int, last_seq: int, max_points: int
) -> list[Point] | None:
    """The rank's points from its rollups and the lines after them; None when the rollups do not cover
    its lines from the first one (lines stored without rollups)."""
    level = next((size for size in LEVELS if last_seq / size <= 2 * max_points), LEVELS[-1])
    query = (
        select(cast(JobMetricRollup.point, Text))  # as text: one json.loads for all runs, not one per run
        .where(
            JobMetricRollup.job_id == job_id,
            JobMetricRollup.phase == phase,
            JobMetricRollup.rank == rank,
            JobMetricRollup.lines == level,
        )
        .order_by(col(JobMetricRollup.first_seq))
    )
    runs: list[Point] = json.loads("[" + ",".join(session.exec(query).all()) + "]")
    covered = len(runs) * level
    if not runs or runs[-1]["seq"] != covered:
        return None
    tail = _raw_points(session, job_id, phase, rank, after_seq=covered)
    return runs + ([merge(tail)] if tail else [])


def chart_points(
    session: Session, job_id: int, ranks: list[int], max_points: int, phase: str = DISTILL
) -> tuple[list[Point], int]:
    """(points of each rank of `phase` in order, at most `max_points` per rank; telemetry lines in all)."""
    points: list[Point] = []
    total = 0
    for rank in ranks:
        last_seq = session.exec(
            select(func.max(JobMetric.seq)).where(
                JobMetric.job_id == job_id, JobMetric.phase == phase, JobMetric.rank == rank
            )
        ).one()  # an index lookup, unlike counting the lines
        if last_seq is None or last_seq < 1:
            continue
        units = _from_rollups(session, job_id, phase, rank, last_seq, max_points) if last_seq > max_points else None
        if units is None:  # few lines, or no rollups: the lines themselves
            units = _raw_points(session, job_id, phase, rank)
        points.extend(downsample(units, max_points))
        total += sum(unit["count"] for unit in units)
    return points, total
