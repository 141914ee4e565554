"""Logs of a job: torchrun's launcher log or one rank's output, read by byte offset."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from app.api.schemas import AUTH_ERRORS, LogChunk, job_errors
from app.deps import JobDep, ReadAccess

router = APIRouter(prefix="/jobs/{job_id}/logs", tags=["logs"], responses=AUTH_ERRORS)
CHUNK_MAX = 1 << 20


@router.get(
    "",
    dependencies=[ReadAccess],
    response_model=LogChunk,
    responses=job_errors(
        not_found="the job has no logs yet (they appear once a worker starts it)",
        invalid="`rank` is not one of the job's ranks",
    ),
)
def read_logs(
    job: JobDep,
    rank: Annotated[int | None, Query(ge=0, description="a rank's log; omitted: the launcher (torchrun) log")] = None,
    offset: Annotated[int, Query(ge=0, description="byte offset to read from (next_offset of the last call)")] = 0,
    limit: Annotated[int, Query(ge=1, le=CHUNK_MAX, description="bytes to read at most")] = 65536,
) -> dict[str, Any]:
    """A chunk of a log file; poll again from `next_offset` to follow it."""
    if rank is not None and rank >= job.nproc:
        raise HTTPException(422, f"rank: job {job.id} has ranks 0..{job.nproc - 1}, got {rank}")
    if job.run_dir is None:
        raise HTTPException(
            404, f"job {job.id} is {job.state} and has no logs yet; they appear once a worker starts it"
        )
    name = "launcher.log" if rank is None else f"rank-{rank}.log"
    path = Path(job.run_dir) / "logs" / name
    size = path.stat().st_size if path.exists() else 0
    data = b""
    if offset < size:
        with path.open("rb") as handle:
            handle.seek(offset)
            data = handle.read(limit)
    return {
        "job_id": job.id,
        "rank": rank,
        "file": name,
        "offset": offset,
        "next_offset": offset + len(data),
        "size": size,
        "text": data.decode("utf-8", "replace"),
    }
