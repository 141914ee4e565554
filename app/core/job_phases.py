"""What the jobs table keeps of a job's phases (`Job.phases`): each phase's record as the engine writes it
(pipebd_core.documents.phases.PhaseRecord), stored by the worker, read by the API, the dashboard and the
webhooks. Entries stored by an earlier engine may lack keys other than `name`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Required  # pydantic reads TypedDicts from typing_extensions on 3.11

from typing_extensions import TypedDict

from pipebd_core.documents.phases import PhaseRecord


class PhaseEntry(TypedDict, total=False):
    """One phase of a job as stored: where it stands and, once ended, how it ended."""

    name: Required[str]
    runs: str  # torchrun, process or local
    state: str  # pending, running or ended
    outcome: str | None  # once ended: succeeded, failed, cancelled or skipped
    reason: str | None
    started_at: float | None
    ended_at: float | None
    outputs: list[str]


def phase_entries(records: Sequence[PhaseRecord]) -> list[PhaseEntry]:
    """The records as the jobs table keeps them (their JSON)."""
    return [
        PhaseEntry(
            name=record.name,
            runs=record.runs,
            state=record.state,
            outcome=record.outcome,
            reason=record.reason,
            started_at=record.started_at,
            ended_at=record.ended_at,
            outputs=list(record.outputs),
        )
        for record in records
    ]
