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
    "user_paused": "Someone paused the job: its ranks saved every block and stopped; resume continues from there.",
    "worker_shutdown": "Its worker was shut down: the ranks saved every block and the job went back to the queue.",
}

# Faults of the machine rather than of the job: a job ending by one is requeued and resumes from its checkpoints
# (up to its max_restarts). A rank_error (a bug in a factory), a launch_error (a bad spec) or an OOM that a rank
# reported itself would only happen again, so they are never retried.
INFRASTRUCTURE_FAULTS = ("worker_lost", "rank_killed")
TERMINATION_REASONS["rank_killed"] = "A rank was killed by SIGKILL (most often the kernel's out-of-memory killer)."


def fault_of(reason: str | None, exit_code: int | None, error: str | None) -> str | None:
    """The infrastructure fault a failure was (one of INFRASTRUCTURE_FAULTS), or None for the job's own failure.

    The diagnosis calls a SIGKILLed rank `oom` (the OOM killer is its usual sender); only that kill, seen in
    the exit code or the launcher's log, is a fault of the machine: an out-of-memory error a rank raised is not."""
    if reason in INFRASTRUCTURE_FAULTS:
        return reason
    killed = exit_code in (-9, 137) or "killed by SIGKILL" in (error or "")
    return "rank_killed" if reason in ("oom", "exit_code") and killed else None


def check_reason(reason: str | None) -> None:
    """Refuse a termination reason the table does not know."""
    if reason is not None and reason not in TERMINATION_REASONS:
        raise ValueError(f"unknown termination reason {reason!r}; known: {', '.join(TERMINATION_REASONS)}")
