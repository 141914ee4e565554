"""A rank's error report (errors/<phase>/rank-<r>.json): what a rank that raised writes before it exits,
so the supervisor can name the root cause (pipebd_core/job/diagnosis.py)."""

from __future__ import annotations

from pipebd_core.documents.base import Document


class RankError(Document):
    """One rank's exception: which rank, when, its type, message and traceback."""

    NAME = "rank error report"
    VERSION = 1

    rank: int
    time: float  # when it raised (seconds since the epoch): the earliest report is the root cause
    type: str  # the exception's class name
    message: str
    traceback: str

    def describe(self) -> str:
        """The text a user reads: which rank failed how, then its traceback."""
        return f"rank {self.rank} failed: {self.type}: {self.message}\n{self.traceback}"


class PlanError(ValueError):
    """A plan that cannot run; the message quotes the numbers that disagree and what would work."""
