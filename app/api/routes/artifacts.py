"""Artifacts of a job: student weights, compressed model, plan, summary, metrics as CSV, model folders as
tar or zip archives (`<folder>.tar`, `<folder>.zip`, streamed with its Content-Length; its sha256 at
`<folder>.tar.sha256`, `<folder>.zip.sha256`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Literal

from fastapi import APIRouter, Path, Request, Response
from fastapi.responses import FileResponse, PlainTextResponse, StreamingResponse

from app.api.deps import JobDep, ReadAccess, SessionDep
from app.api.schemas import AUTH_ERRORS, JOB_ERRORS, ArtifactEntry, ArtifactList, Plan, job_errors
from app.core.tables import Job
from app.services.artifacts import (
    CSV_ARTIFACT,
    FILE_ARTIFACTS,
    FOLDER_ARTIFACTS,
    METRICS_CSV,
    archive_format,
    available,
    file_path,
    folder_entries,
    has_metrics,
    metrics_csv,
)
from app.services.errors import ServiceError

router = APIRouter(prefix="/jobs/{job_id}", tags=["artifacts"], responses=AUTH_ERRORS)
SHA256 = ".sha256"
DOWNLOADS = [*FILE_ARTIFACTS.values(), *FOLDER_ARTIFACTS.values(), CSV_ARTIFACT]
DOWNLOAD_TYPES = sorted({artifact.media_type for artifact in DOWNLOADS} | {"text/plain"})
if TYPE_CHECKING:
    ArtifactName = str
else:  # an enum in the schema, checked by FastAPI: exactly the names that can be downloaded
    ArtifactName = Literal[
        tuple([*FILE_ARTIFACTS, *FOLDER_ARTIFACTS, *(n + SHA256 for n in FOLDER_ARTIFACTS), METRICS_CSV])
    ]


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
        raise ServiceError(404, f"job {job.id} is {job.state} and has no plan yet; a worker writes it before launch")
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
            sha256_url=(
                str(request.url_for("read_artifact", job_id=job.id, name=artifact.name + SHA256).path)
                if artifact.name in FOLDER_ARTIFACTS
                else None
            ),
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
            "description": (
                "the file, as an attachment named `job-<id>-<name>`; a folder `<folder>.tar` or `<folder>.zip`"
                " as a tar or zip archive of its files under `<folder>/`, streamed with its Content-Length;"
                " `<folder>.tar.sha256` (`.zip.sha256`) that archive's sha256 as one `sha256sum` line"
                " (`<hex>  job-<id>-<folder>.tar`)"
            ),
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
    if name.removesuffix(SHA256) in FOLDER_ARTIFACTS:
        return read_archive(job, name)
    path = file_path(job, name)
    if path is None:
        raise ServiceError(404, f"job {job.id} ({job.state}) has no {name} (yet); GET .../artifacts lists what it has")
    return FileResponse(path, media_type=FILE_ARTIFACTS[name].media_type, filename=f"job-{job.id}-{name}")


def read_archive(job: Job, name: str) -> Response:
    """A folder artifact streamed as a tar or zip (with its Content-Length), or that archive's sha256 line."""
    archive = name.removesuffix(SHA256)
    listing = folder_entries(job, archive)
    if listing is None:
        raise ServiceError(
            404, f"job {job.id} ({job.state}) has no {archive} (yet); GET .../artifacts lists what it has"
        )
    filename, kind = f"job-{job.id}-{archive}", archive_format(archive)
    if name.endswith(SHA256):
        return PlainTextResponse(f"{kind.sha256(listing)}  {filename}\n")
    headers = {"Content-Disposition": f'attachment; filename="{filename}"', "Content-Length": str(kind.size(listing))}
    return StreamingResponse(kind.stream(listing), media_type=kind.media_type, headers=headers)
