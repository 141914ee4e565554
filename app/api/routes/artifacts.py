"""Artifacts of a job: student weights, compressed model, plan, summary, metrics as CSV."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.responses import FileResponse

from app.artifacts import CSV_ARTIFACT, FILE_ARTIFACTS, METRICS_CSV, available, file_path, has_metrics, metrics_csv
from app.deps import JobDep, ReadAccess, SessionDep

router = APIRouter(prefix="/jobs/{job_id}", tags=["artifacts"])


@router.get("/plan", dependencies=[ReadAccess])
def read_plan(job: JobDep) -> Any:
    """The resolved plan (stages, routes, what each rank runs, predictions when profiled)."""
    path = file_path(job, "plan.json")
    if path is None:
        raise HTTPException(404, f"job {job.id} is {job.state} and has no plan yet; a worker writes it before launch")
    return FileResponse(path, media_type="application/json")


@router.get("/artifacts", dependencies=[ReadAccess])
def list_artifacts(job: JobDep, session: SessionDep, request: Request) -> dict[str, Any]:
    """What can be downloaded now; files appear as the job writes them (weights at the end)."""
    items = [
        {
            "name": artifact.name,
            "media_type": artifact.media_type,
            "size": size,
            "description": artifact.description,
            "url": str(request.url_for("read_artifact", job_id=job.id, name=artifact.name).path),
        }
        for artifact, size in available(session, job)
    ]
    return {"job_id": job.id, "state": job.state, "data": items}


@router.get("/artifacts/{name}", dependencies=[ReadAccess], response_model=None)
def read_artifact(name: str, job: JobDep, session: SessionDep) -> Response:
    """Download one artifact by name."""
    if name == METRICS_CSV and has_metrics(session, job):
        headers = {"Content-Disposition": f'attachment; filename="job-{job.id}-metrics.csv"'}
        return Response(metrics_csv(session, job), media_type=CSV_ARTIFACT.media_type, headers=headers)
    path = file_path(job, name)
    if path is None:
        known = ", ".join([*FILE_ARTIFACTS, METRICS_CSV])
        raise HTTPException(404, f"job {job.id} ({job.state}) has no artifact {name!r}; artifacts are named {known}")
    return FileResponse(path, media_type=FILE_ARTIFACTS[name].media_type, filename=f"job-{job.id}-{name}")
