"""The phases record (phases.json): the names of a job's phases, and each phase's state and outcome.

The one module that names the phases; what each one runs is pipebd_core/job/phases.py's. A phase is
`pending`, `running` or `ended`; an ended phase `succeeded`, `failed`, was `cancelled` or `skipped`
(nothing to do: a cached profile), with a reason (a termination reason, or why it was skipped).
"""

from __future__ import annotations

import time
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict

from pipebd_core.documents.base import Document

PROFILE: Final = "profile"
PLAN: Final = "plan"
DISTILL: Final = "distill"
FINALIZE: Final = "finalize"
PROFILE_FINETUNE: Final = "profile_finetune"
PLAN_FINETUNE: Final = "plan_finetune"
FINETUNE: Final = "finetune"
EVALUATE: Final = "evaluate"
PHASE_NAMES = (PROFILE, PLAN, DISTILL, FINALIZE, PROFILE_FINETUNE, PLAN_FINETUNE, FINETUNE, EVALUATE)
TRAINING_PHASES = (DISTILL, FINETUNE)  # the phases whose ranks write a telemetry line per step
TrainingPhase = Literal["distill", "finetune"]

SUCCEEDED: Final = "succeeded"
FAILED: Final = "failed"
CANCELLED: Final = "cancelled"
SKIPPED: Final = "skipped"  # a phase only: nothing to do (a cached profile)
PhaseOutcome = Literal["succeeded", "failed", "cancelled", "skipped"]
OUTCOMES: tuple[str, ...] = (SUCCEEDED, FAILED, CANCELLED, SKIPPED)

PENDING: Final = "pending"
RUNNING: Final = "running"
ENDED: Final = "ended"
PhaseState = Literal["pending", "running", "ended"]
Runs = Literal["torchrun", "process", "local"]


class PhaseRecord(BaseModel):
    """One phase of one job: where it stands and, once ended, how it ended."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    name: str
    runs: Runs  # torchrun: a process per rank; process: one process; local: a forked child (job/isolated.py)
    state: PhaseState = PENDING
    outcome: PhaseOutcome | None = None  # once ended
    reason: str | None = None  # a termination reason (pipebd_core/job/outcomes.py), or why it was skipped
    started_at: float | None = None
    ended_at: float | None = None
    outputs: list[str] = []  # what it writes, relative to the run directory

    def to_json(self) -> dict[str, object]:
        return self.model_dump(mode="json")

    @property
    def done(self) -> bool:
        """Nothing more to do for it: it succeeded or was skipped."""
        return self.outcome in (SUCCEEDED, SKIPPED)

    def start(self) -> None:
        self.state, self.outcome, self.reason = RUNNING, None, None
        self.started_at, self.ended_at = time.time(), None

    def reset(self) -> None:
        """To be run again, as if it never ran (an elastic job's plan for the nodes it has now)."""
        self.state, self.outcome, self.reason = PENDING, None, None
        self.started_at = self.ended_at = None

    def end(self, outcome: PhaseOutcome, reason: str | None = None) -> None:
        stamp = time.time()
        self.state, self.outcome, self.reason = ENDED, outcome, reason
        self.started_at = self.started_at or stamp
        self.ended_at = stamp

    @property
    def duration_s(self) -> float | None:
        if self.started_at is None:
            return None
        return (self.ended_at or time.time()) - self.started_at


class PhasesRecord(Document):
    """phases.json: every phase of the job, in the order they run."""

    NAME = "phases.json"
    VERSION = 1

    phases: list[PhaseRecord]


def current(records: list[PhaseRecord]) -> PhaseRecord | None:
    """The phase running now, else the next one to run, else None (every phase is done)."""
    running = [record for record in records if record.state == RUNNING]
    if running:
        return running[0]
    return next((record for record in records if not record.done), None)
