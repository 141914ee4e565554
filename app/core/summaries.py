"""A job's summary.json as the service reads it: the pages, the comparison and a sweep's objective all read
it through `read_summary`, which gives None rather than failing for a file being replaced, gone, or written
by an earlier PipeBD."""

from __future__ import annotations

import json
from pathlib import Path

from app.core.tables import Job
from pipebd_core.documents.base import DocumentError
from pipebd_core.documents.summary import Summary
from pipebd_core.rundir import RunDir

SUMMARY = "summary.json"


def read_summary(job: Job) -> Summary | None:
    """The job's summary.json; None until a phase wrote it, or for one an earlier PipeBD wrote (this one
    cannot read it: the pages and sweeps show none, and the file still downloads)."""
    return summary_in(job.run_dir)


def summary_in(run_dir: str | None) -> Summary | None:
    """The summary.json of the run directory `run_dir` (a job's `run_dir` column), as `read_summary`."""
    if run_dir is None:
        return None
    try:
        value = json.loads(RunDir(Path(run_dir)).output(SUMMARY).read_text())
    except (OSError, ValueError):  # not written yet, being replaced, or gone with its run directory
        return None
    try:
        return Summary.from_json(value)
    except DocumentError:
        return None
