"""How a job or a phase can end, and why: the one table of termination reasons, and the termination record.

The engine (its supervisor and diagnosis), the service's lifecycle (app/core/lifecycle.py `settle`) and the
dashboard all read this table; a reason that is not here cannot be recorded. A `Termination` is how a job
or a phase ended other than by succeeding: its reason, the text to show, and whether it was a fault of the
machine (then the service may retry it from its checkpoints) or of the job (then it would only happen again).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipebd_core.documents.phases import CANCELLED, FAILED, SKIPPED, SUCCEEDED

Result = Literal["succeeded", "failed", "cancelled"]  # how a job (or a phase's processes) ended
__all__ = ["CANCELLED", "FAILED", "SKIPPED", "SUCCEEDED", "Result", "Termination"]

# Why a job ended other than by succeeding, and what a user reads about it.
TERMINATION_REASONS: dict[str, str] = {
    "user_cancelled": "Someone cancelled the job.",
    "exit_code": "The ranks exited with a non-zero code without reporting an error; the launcher log says more.",
    "rank_error": "A rank raised an exception; its traceback is below.",
    "oom": "A rank ran out of memory. Give each rank fewer rows (a smaller batch, more replicas) or fewer blocks.",
    "rank_killed": "A rank was killed by SIGKILL (most often the kernel's out-of-memory killer).",
    "timeout": "The job ran longer than the server's time limit (PIPEBD_JOB_TIMEOUT_S) and was stopped.",
    "worker_lost": "Its worker stopped sending heartbeats (it died or was shut down); its ranks were killed.",
    "launch_error": "The job could not be prepared or planned (data set, workload or plan); see the error below.",
    "user_paused": "Someone paused the job: its ranks saved every block and stopped; resume continues from there.",
    "node_lost": "Another node of the job failed (its ranks, its worker or its host); this node's ranks were stopped.",
    "worker_shutdown": "Its worker was shut down: the ranks saved every block and the job went back to the queue.",
    "grown": "More hosts were free: the ranks saved every block and the job went back to the queue to resume on"
    " a larger gang, re-planned (an elastic job below its max_nodes).",
}

# Faults of the machine rather than of the job: a job ending by one is requeued and resumes from its checkpoints
# (up to its max_restarts). A rank_error (a bug in a factory), a launch_error (a bad spec) or an out-of-memory
# error that a rank raised itself would only happen again, so they are never retried.
INFRASTRUCTURE_FAULTS = frozenset({"worker_lost", "rank_killed", "node_lost"})


def check_reason(reason: str | None) -> None:
    """Refuse a termination reason the table does not know."""
    if reason is not None and reason not in TERMINATION_REASONS:
        raise ValueError(f"unknown termination reason {reason!r}; known: {', '.join(TERMINATION_REASONS)}")


@dataclass(frozen=True)
class Termination:
    """Why a job or a phase ended other than by succeeding."""

    reason: str  # a key of TERMINATION_REASONS
    error: str | None = None  # the text to show: a traceback, a log's tail, what stopped it

    def __post_init__(self) -> None:
        check_reason(self.reason)

    @property
    def explanation(self) -> str:
        """What a user reads about the reason."""
        return TERMINATION_REASONS[self.reason]

    @property
    def infrastructure(self) -> bool:
        """A fault of the machine (a lost worker, a killed rank), not of the job."""
        return self.reason in INFRASTRUCTURE_FAULTS

    @property
    def retryable(self) -> bool:
        """Whether running the job again from its checkpoints may succeed: only after a fault of the machine
        (the job's own failures, a cancel or a time limit would end the same way)."""
        return self.infrastructure
