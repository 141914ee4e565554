"""What a job leaves behind, by name: the documented outputs of its run directory and the metrics as CSV.

The files are exactly `pipebd_core.rundir.OUTPUTS`, and the folders (model directories) exactly
`FOLDER_OUTPUTS`, each offered as one archive `<name>.tar` or `<name>.zip` (app/services/archives.py), so whatever the
engine documents can be listed and downloaded. The API serves them from the run directory, so the API and
the workers must share the runs folder (one machine, or a shared volume as in docker-compose.yml).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlmodel import Session, col, select

from app.core.tables import Job, JobMetric
from app.services.archives import (
    TAR_MEDIA_TYPE,
    ZIP_MEDIA_TYPE,
    Entry,
    entries,
    tar_sha256,
    tar_size,
    tar_stream,
    zip_sha256,
    zip_size,
    zip_stream,
)
from pipebd_core.documents.phases import DISTILL
from pipebd_core.documents.telemetry import DistillLine
from pipebd_core.rundir import FOLDER_OUTPUTS, OUTPUTS, STEP_PHASES, Output, RunDir

METRICS_CSV = "metrics.csv"


FILE_ARTIFACTS: dict[str, Output] = {output.name: output for output in OUTPUTS}
CSV_ARTIFACT = Output(METRICS_CSV, "text/csv", "every distillation telemetry line of every rank")
TAR, ZIP = ".tar", ".zip"


@dataclass(frozen=True)
class ArchiveFormat:
    """How a folder output is offered as one file: `<folder><suffix>`, its entries under `<folder>/`."""

    suffix: str
    media_type: str
    what: str
    size: Callable[[list[Entry]], int]  # known before the first byte: the Content-Length
    stream: Callable[[list[Entry]], Iterator[bytes]]
    sha256: Callable[[list[Entry]], str]


ARCHIVE_FORMATS = {
    TAR: ArchiveFormat(TAR, TAR_MEDIA_TYPE, "a tar archive", tar_size, tar_stream, tar_sha256),
    ZIP: ArchiveFormat(ZIP, ZIP_MEDIA_TYPE, "a zip archive", zip_size, zip_stream, zip_sha256),
}
# a folder output as artifacts: `<name>.tar` and `<name>.zip`, archives of the folder (entries under `<name>/`)
FOLDER_ARTIFACTS: dict[str, Output] = {
    folder.name + kind.suffix: Output(folder.name + kind.suffix, kind.media_type, f"{folder.description} ({kind.what})")
    for folder in FOLDER_OUTPUTS
    for kind in ARCHIVE_FORMATS.values()
}


def archive_format(name: str) -> ArchiveFormat:
    """The format of folder artifact `name` (one of FOLDER_ARTIFACTS), by its suffix."""
    return ARCHIVE_FORMATS[Path(name).suffix]


def file_path(job: Job, name: str) -> Path | None:
    """The file behind artifact `name`, if the job has it."""
    if job.run_dir is None or name not in FILE_ARTIFACTS:
        return None
    path = RunDir(Path(job.run_dir)).output(name)
    return path if path.is_file() else None


def folder_entries(job: Job, name: str) -> list[Entry] | None:
    """The archive entries of folder artifact `name` (`<folder>.tar`, `<folder>.zip`), if the job has that folder."""
    if job.run_dir is None or name not in FOLDER_ARTIFACTS:
        return None
    folder = RunDir(Path(job.run_dir)).folder_output(name.removesuffix(archive_format(name).suffix))
    return entries(folder, folder.name) if folder.is_dir() else None


def has_metrics(session: Session, job: Job) -> bool:
    return session.exec(select(JobMetric.id).where(JobMetric.job_id == job.id).limit(1)).first() is not None


def available(session: Session, job: Job) -> list[tuple[Output, int | None]]:
    """(artifact, size in bytes or None when generated) for everything the job has now."""
    found: list[tuple[Output, int | None]] = []
    for name, artifact in FILE_ARTIFACTS.items():
        path = file_path(job, name)
        if path is not None:
            found.append((artifact, path.stat().st_size))
    for name, artifact in FOLDER_ARTIFACTS.items():
        listing = folder_entries(job, name)
        if listing is not None:
            found.append((artifact, archive_format(name).size(listing)))
    if has_metrics(session, job):
        found.append((CSV_ARTIFACT, None))
    return found


def metrics_csv(session: Session, job: Job) -> str:
    """One row per telemetry line: position, loss per block, phase seconds, samples, peak and current memory,
    GPU utilisation (empty on CPU ranks)."""
    rows = session.exec(
        select(JobMetric)
        .where(JobMetric.job_id == job.id, JobMetric.phase == DISTILL)
        .order_by(col(JobMetric.rank), col(JobMetric.seq))
    ).all()
    lines = [DistillLine.from_json(row.record) for row in rows]
    blocks = sorted({block for line in lines for block in line.loss})
    out = io.StringIO()
    writer = csv.writer(out)
    position = ["rank", "seq", "epoch", "step", "time", *(f"loss_{b}" for b in blocks), *STEP_PHASES]
    writer.writerow([*position, "samples", "peak_mem", "cur_mem", "gpu_util"])
    for row, line in zip(rows, lines, strict=True):
        writer.writerow(
            [
                row.rank,
                row.seq,
                row.epoch,
                row.step,
                row.time,
                *(line.loss.get(b, "") for b in blocks),
                *(line.phases.get(phase, "") for phase in STEP_PHASES),
                line.samples,
                line.peak_mem,
                line.cur_mem,
                "" if line.gpu_util is None else line.gpu_util,
            ]
        )
    return out.getvalue()
