"""How a job or a phase can end, and why: the one table of termination reasons and their explanations.

The engine (its supervisor and diagnosis), the service's lifecycle and the dashboard all read this
table; a reason that is not here cannot be recorded.
"""

from __future__ import annotations

from typing import Final, Literal

SUCCEEDED: Final = "succeeded"
FAILED: Final = "failed"
CANCELLED: Final = "cancelled"
SKIPPED: Final = "skipped"  # a phase only: nothing to do (a cached profile)
Result = Literal["succeeded", "failed", "cancelled"]

# Why a job ended other than by succeeding, and what a user reads about it.
TERMINATION_REASONS: dict[str, str] = {
    "user_cancelled": "Someone cancelled the job.",
    "exit_code": "The ranks exited with a non-zero code without reporting an error; the launcher log says more.",
    "rank_error": "A rank raised an exception; its traceback is below.",
    "oom": "A rank ran out of memory. Give each rank fewer rows (a smaller batch, more replicas) or fewer blocks.",
    "timeout": "The job ran longer than the server's time limit (PIPEBD_JOB_TIMEOUT_S) and was stopped.",
    "worker_lost": "Its worker stopped sending heartbeats (it died or was shut down); its ranks were killed.",
    "launch_error": "The job could not be prepared or planned (data set, workload or plan); see the error below.",
}


def check_reason(reason: str | None) -> None:
    """Refuse a termination reason the table does not know."""
    if reason is not None and reason not in TERMINATION_REASONS:
        raise ValueError(f"unknown termination reason {reason!r}; known: {', '.join(TERMINATION_REASONS)}")
