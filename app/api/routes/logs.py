"""Logs of a job: a phase's launcher log (torchrun's) or one rank's output, read by byte offset."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from fastapi import APIRouter, Query

from app.api.deps import JobDep, ReadAccess
from app.api.schemas import AUTH_ERRORS, LogChunk, job_errors
from app.core.tables import DB_INT_MAX, Job
from app.services.errors import ServiceError, invalid
from pipebd_core.documents.phases import DISTILL
from pipebd_core.job.phases import PHASE_KINDS
from pipebd_core.rundir import RunDir

router = APIRouter(prefix="/jobs/{job_id}/logs", tags=["logs"], responses=AUTH_ERRORS)
CHUNK_MAX = 1 << 20
OFFSET_MAX = 2**63 - 1  # the largest file offset
LOGGED_PHASES = [name for name, kind in PHASE_KINDS.items() if kind.runs != "local"]
if TYPE_CHECKING:
    LoggedPhase = str
else:  # an enum in the schema, checked by FastAPI: the phases that write logs (any new one included)
    LoggedPhase = Literal[tuple(LOGGED_PHASES)]


def log_path(run_dir: RunDir, phase: str, rank: int | None, node: int = 0) -> Path:
    """A rank's log, or (rank None) node `node`'s launcher log."""
    return run_dir.launcher_log(phase, node) if rank is None else run_dir.log(rank, phase)


def default_phase(job: Job, run_dir: RunDir, rank: int | None, node: int = 0) -> str:
    """The newest phase, up to the current one, that has this log; `distill` before any has."""
    names = [entry["name"] for entry in job.phases or []]
    upto = names[: names.index(job.phase) + 1] if job.phase in names else []
    logged = [name for name in upto if name in LOGGED_PHASES and log_path(run_dir, name, rank, node).exists()]
    return logged[-1] if logged else DISTILL


@router.get(
    "",
    dependencies=[ReadAccess],
    response_model=LogChunk,
    responses=job_errors(
        not_found="the job has no logs yet (they appear once a worker starts it)",
        invalid="`rank` is not one of the job's ranks, or `phase` is not a phase with logs",
    ),
)
def read_logs(
    job: JobDep,
    rank: Annotated[
        int | None, Query(ge=0, le=DB_INT_MAX, description="a rank's log; omitted: the launcher (torchrun) log")
    ] = None,
    phase: Annotated[
        LoggedPhase | None,
        Query(description="the phase whose log to read; omitted: the newest one so far with this log"),
    ] = None,
    node: Annotated[
        int | None,
        Query(ge=0, le=DB_INT_MAX, description="with `rank` omitted: node k's launcher log (a job on several nodes)"),
    ] = None,
    offset: Annotated[
        int, Query(ge=0, le=OFFSET_MAX, description="byte offset to read from (next_offset of the last call)")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=CHUNK_MAX, description="bytes to read at most")] = 65536,
) -> LogChunk:
    """A chunk of a log file; poll again from `next_offset` to follow it."""
    if rank is not None and rank >= job.world_size:
        raise invalid(["query", "rank"], f"job {job.id} has ranks 0..{job.world_size - 1}", rank)
    if node is not None and (rank is not None or node >= job.nodes):
        why = "give `rank` or `node`, not both" if rank is not None else f"job {job.id} has nodes 0..{job.nodes - 1}"
        raise invalid(["query", "node"], why, node)
    if job.run_dir is None:
        raise ServiceError(404, f"job {job.id} is {job.state} and has no logs yet; they appear once a worker starts it")
    run_dir = RunDir(Path(job.run_dir))
    phase = phase or default_phase(job, run_dir, rank, node or 0)
    path = log_path(run_dir, phase, rank, node or 0)
    size = path.stat().st_size if path.exists() else 0
    data = b""
    if offset < size:
        with path.open("rb") as handle:
            handle.seek(offset)
            data = handle.read(limit)
    assert job.id is not None
    return LogChunk(
        job_id=job.id,
        phase=phase,
        rank=rank,
        node=None if rank is not None else node or 0,
        file=str(path.relative_to(run_dir.root)),
        offset=offset,
        next_offset=offset + len(data),
        size=size,
        text=data.decode("utf-8", "replace"),
    )
