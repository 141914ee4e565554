"""Artifacts of a job: student weights, compressed model, plan, summary, metrics as CSV."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Literal

from fastapi import APIRouter, Path, Request, Response
from fastapi.responses import FileResponse

from app.api.deps import JobDep, ReadAccess, SessionDep
from app.api.problems import ApiError
from app.api.schemas import AUTH_ERRORS, JOB_ERRORS, ArtifactEntry, ArtifactList, Plan, job_errors
from app.services.artifacts import (
    CSV_ARTIFACT,
    FILE_ARTIFACTS,
    METRICS_CSV,
    available,
    file_path,
    has_metrics,
    metrics_csv,
)

router = APIRouter(prefix="/jobs/{job_id}", tags=["artifacts"], responses=AUTH_ERRORS)
DOWNLOAD_TYPES = sorted({artifact.media_type for artifact in [*FILE_ARTIFACTS.values(), CSV_ARTIFACT]})
if TYPE_CHECKING:
    ArtifactName = str
else:  # an enum in the schema, checked by FastAPI: exactly the names that can be downloaded
    ArtifactName = Literal[tuple([*FILE_ARTIFACTS, METRICS_CSV])]


@router.get(
    "/plan",
    dependencies=[ReadAccess],
    response_model=Plan,
    response_model_exclude_unset=True,  # optional keys a plan lacks stay absent
    responses=job_errors(not_found="the job has no plan yet (a worker writes it before launch)"),
)
def read_plan(job: JobDep) -> Plan:
    """The resolved plan (stages, routes, what each rank runs, predictions when profiled): plan.json."""
    path = file_path(job, "plan.json")
    if path is None:
        raise ApiError(404, f"job {job.id} is {job.state} and has no plan yet; a worker writes it before launch")
    return Plan.model_validate(json.loads(path.read_text()))  # its keys as written: unset ones stay absent


@router.get("/artifacts", dependencies=[ReadAccess], response_model=ArtifactList, responses=JOB_ERRORS)
def list_artifacts(job: JobDep, session: SessionDep, request: Request) -> ArtifactList:
    """What can be downloaded now; files appear as the job writes them (weights at the end)."""
    items = [
        ArtifactEntry(
            name=artifact.name,
            media_type=artifact.media_type,
            size=size,
            description=artifact.description,
            url=str(request.url_for("read_artifact", job_id=job.id, name=artifact.name).path),
        )
        for artifact, size in available(session, job)
    ]
    assert job.id is not None
    return ArtifactList(job_id=job.id, state=job.state, data=items)


@router.get(
    "/artifacts/{name}",
    dependencies=[ReadAccess],
    response_model=None,
    response_class=FileResponse,  # documents no JSON body: the 200 content types are listed below
    responses={
        200: {
            "description": "the file, as an attachment named `job-<id>-<name>`",
            "content": {
                media_type: {"schema": {"type": "string", "format": "binary"}} for media_type in DOWNLOAD_TYPES
            },
        },
        **job_errors(not_found="the job has no artifact of this name (yet)"),
    },
)
def read_artifact(
    name: Annotated[ArtifactName, Path(description="an artifact's name (the list names them)")],
    job: JobDep,
    session: SessionDep,
) -> Response:
    """Download one artifact by name."""
    if name == METRICS_CSV and has_metrics(session, job):
        headers = {"Content-Disposition": f'attachment; filename="job-{job.id}-metrics.csv"'}
        return Response(metrics_csv(session, job), media_type=CSV_ARTIFACT.media_type, headers=headers)
    path = file_path(job, name)
    if path is None:
        raise ApiError(404, f"job {job.id} ({job.state}) has no {name} (yet); GET .../artifacts lists what it has")
    return FileResponse(path, media_type=FILE_ARTIFACTS[name].media_type, filename=f"job-{job.id}-{name}")
