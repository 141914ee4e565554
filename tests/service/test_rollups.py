"""Service tier: chart rollups (app/core/rollups.py) on SQLite and PostgreSQL. Written with the lines as
the worker stores them, they are read back as at most `max_points` points per rank, every line
counted once, every spike kept; a rank whose rollups do not add up is downsampled from its lines."""

from __future__ import annotations

import statistics

from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlmodel import Session, col, func, select

from app.core.database import get_engine, migrate
from app.core.downsample import downsample, to_point
from app.core.rollups import LEVELS, RollupBuilder, chart_points
from app.core.settings import Settings
from app.core.tables import JobMetric, JobMetricRollup
from pipebd_core.documents.telemetry import DistillLine
from tests.service.factories import insert_job, insert_metrics
from tests.telemetry_lines import distill_line


def line(rank: int, seq: int, loss: float) -> DistillLine:
    return distill_line(
        rank,
        seq - 1,
        time=1000.0 + seq,
        loss={rank: loss},
        phases={"teacher": 0.01 * (seq % 3), "student": 0.02},
        samples=8 + seq % 2,
        peak_mem=100 + seq,
        done=seq,
        total=0,
    )


def store(settings: Settings, job_id: int, lines: list[DistillLine], builder: RollupBuilder) -> None:
    """Lines and the rollups they complete, in one transaction, as worker/streaming.py stores them."""
    with Session(get_engine(settings.database)) as session:
        rows = [
            JobMetric(job_id=job_id, rank=r.rank, seq=r.seq, epoch=0, step=r.step, time=r.time, record=r.to_json())
            for r in lines
        ]
        session.add_all(rows)
        session.add_all(builder.add([to_point(r) for r in lines]))
        session.commit()


def losses(count: int) -> list[float]:
    values = [1.0 / (1 + i % 7) for i in range(count)]
    values[500], values[777] = 100.0, -5.0  # a spike and a dip that must survive
    return values


def test_builder_writes_complete_runs_at_every_level() -> None:
    builder = RollupBuilder(job_id=1)
    rows = builder.add([to_point(line(0, seq, float(seq))) for seq in range(1, 71)])
    by_size = {size: [row for row in rows if row.lines == size] for size in LEVELS}
    assert [len(by_size[size]) for size in (4, 16, 64, 256)] == [17, 4, 1, 0]
    run = by_size[16][1]
    assert (run.first_seq, run.last_seq, run.point["count"]) == (17, 32, 16)
    assert run.point["loss_min"] == {"0": 17.0} and run.point["loss_max"] == {"0": 32.0}
    assert run.point["loss"]["0"] == statistics.mean(range(17, 33))
    assert by_size[64][0].point["peak_mem"] == 164 and by_size[64][0].point["seq"] == 64


def test_chart_points_read_the_rollups_and_keep_counts_extremes_and_means(settings: Settings) -> None:
    migrate(settings.database)
    job = insert_job(settings, "running")
    assert job.id is not None
    builder = RollupBuilder(job.id)
    values = losses(1000)
    for start in range(0, 1000, 37):  # batches as the streamer polls them, ranks interleaved
        store(settings, job.id, [line(0, seq + 1, values[seq]) for seq in range(start, min(start + 37, 1000))], builder)
        if start < 30:
            store(settings, job.id, [line(1, seq + 1, 0.5) for seq in range(start, min(start + 37, 30))], builder)
    with Session(get_engine(settings.database)) as session:
        # a raw line changed behind the rollups' back: the chart reads the rollups, so it does not see it
        session.execute(
            update(JobMetric)
            .where(col(JobMetric.job_id) == job.id, col(JobMetric.rank) == 0, col(JobMetric.seq) == 300)
            .values(record=line(0, 300, 1e6).to_json())
        )
        session.commit()
        points, total = chart_points(session, job.id, [0, 1], max_points=50)
    assert total == 1030
    rank0 = [p for p in points if p["rank"] == 0]
    assert 25 <= len(rank0) <= 50
    assert sum(p["count"] for p in rank0) == 1000 and rank0[-1]["seq"] == 1000
    assert [p["seq"] for p in rank0] == sorted(p["seq"] for p in rank0)
    assert max(p["loss_max"]["0"] for p in rank0) == 100.0 and min(p["loss_min"]["0"] for p in rank0) == -5.0
    mean = sum(p["loss"]["0"] * p["count"] for p in rank0) / 1000
    assert abs(mean - statistics.mean(values)) < 1e-9
    assert [p["count"] for p in points if p["rank"] == 1] == [1] * 30  # 30 lines: returned as they are


def test_lines_without_rollups_are_downsampled_from_the_lines(settings: Settings) -> None:
    migrate(settings.database)
    job = insert_job(settings, "running")
    assert job.id is not None
    insert_metrics(settings, job.id, 0, losses(1000))  # no rollups, as before they existed
    with Session(get_engine(settings.database)) as session:
        points, total = chart_points(session, job.id, [0], max_points=50)
        rows = session.exec(select(JobMetric).where(JobMetric.job_id == job.id).order_by(col(JobMetric.seq))).all()
    assert total == 1000 and points == downsample([to_point(DistillLine.from_json(row.record)) for row in rows], 50)


def test_the_metrics_route_serves_rollups_and_deleting_the_job_removes_them(
    client: TestClient, settings: Settings
) -> None:
    job = insert_job(settings, "succeeded")
    assert job.id is not None
    store(settings, job.id, [line(0, seq, 1.0) for seq in range(1, 201)], RollupBuilder(job.id))
    answer = client.get(f"/api/v1/jobs/{job.id}/metrics", params={"max_points": 20}).json()
    assert answer["total"] == 200 and answer["downsampled"] and len(answer["points"]) <= 20
    assert sum(point["count"] for point in answer["points"]) == 200
    assert client.delete(f"/api/v1/jobs/{job.id}").status_code == 204
    with Session(get_engine(settings.database)) as session:
        assert session.exec(select(func.count()).select_from(JobMetricRollup)).one() == 0
