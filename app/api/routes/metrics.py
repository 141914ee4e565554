"""Telemetry of a job: per-rank points from the database, downsampled on the server for charts
(from the rollups of app/core/rollups.py for long series, so a long job's chart stays cheap)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlmodel import col, select

from app.api.deps import JobDep, ReadAccess, SessionDep
from app.api.schemas import AUTH_ERRORS, Evaluation, MetricsPage, job_errors
from app.core.downsample import downsample, to_point
from app.core.rollups import chart_points
from app.core.tables import DB_INT_MAX, EVAL_SEQ, JobMetric
from app.services.errors import invalid
from pipebd_core.documents.phases import DISTILL, TrainingPhase
from pipebd_core.documents.telemetry import EvalLine, step_line

router = APIRouter(prefix="/jobs/{job_id}/metrics", tags=["metrics"], responses=AUTH_ERRORS)
MAX_POINTS_LIMIT = 10_000


@router.get(
    "",
    dependencies=[ReadAccess],
    response_model=MetricsPage,
    response_model_exclude_unset=True,  # points of old rollups have no cur_mem, gpu_util: not added as nulls
    responses=job_errors(invalid="`rank` is not one of the job's ranks"),
)
def read_metrics(
    job: JobDep,
    session: SessionDep,
    rank: Annotated[int | None, Query(ge=0, le=DB_INT_MAX, description="one rank only")] = None,
    phase: Annotated[TrainingPhase, Query(description="the phase whose telemetry: distill or finetune")] = DISTILL,
    since_step: Annotated[
        int | None, Query(ge=0, le=DB_INT_MAX, description="only lines at this training step or later")
    ] = None,
    max_points: Annotated[int, Query(ge=2, le=MAX_POINTS_LIMIT, description="points per rank at most")] = 500,
) -> MetricsPage:
    """Points per rank (loss per block, phase times, samples, peak memory); buckets keep their min and max."""
    if rank is not None and rank >= job.world_size:
        raise invalid(["query", "rank"], f"job {job.id} has ranks 0..{job.world_size - 1}", rank)
    assert job.id is not None
    ranks = [rank] if rank is not None else list(range(job.world_size))
    if since_step is None:  # whole series: from the rollups where a rank has more than max_points lines
        points, total = chart_points(session, job.id, ranks, max_points, phase)
    else:
        query = select(JobMetric).where(
            JobMetric.job_id == job.id,
            JobMetric.phase == phase,
            JobMetric.seq != EVAL_SEQ,
            JobMetric.step >= since_step,
            col(JobMetric.rank).in_(ranks),
        )
        rows = session.exec(query.order_by(col(JobMetric.rank), col(JobMetric.seq))).all()
        lines = [step_line(phase, row.record) for row in rows]
        points, total = downsample([to_point(line) for line in lines], max_points), len(rows)
    evals = [
        EvalLine.from_json(record)
        for record in session.exec(
            select(JobMetric.record)
            .where(JobMetric.job_id == job.id, JobMetric.phase == phase, JobMetric.seq == EVAL_SEQ)
            .order_by(col(JobMetric.step))
        ).all()
    ]
    return MetricsPage.model_validate(  # from the points as they are: keys an old rollup lacks stay unset
        {
            "job_id": job.id,
            "phase": phase,
            "evals": [Evaluation(epoch=e.epoch, step=e.step, top1=e.top1, perplexity=e.perplexity) for e in evals],
            "total": total,
            "downsampled": len(points) < total,
            "max_points": max_points,
            "points": points,
        }
    )
