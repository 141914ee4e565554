"""control/stop_at.json: where a phase's ranks stop, once its deciding rank decided (pipebd_core/distill/control.py
writes and reads it)."""

from __future__ import annotations

from typing import Any

from pipebd_core.documents.base import Document


class StopAt(Document):
    """Every rank stops before global step `step` (pipelined plans), or before its task `task` (dp, ls)."""

    NAME = "control/stop_at.json"
    VERSION = 1

    step: int | None = None
    task: int | None = None

    def to_json(self) -> dict[str, Any]:
        """Only the limit that was decided ({"step": P} or {"task": K}), and the format version."""
        return self.model_dump(mode="json", exclude_none=True)

    def reached(self, index: int, step: int) -> bool:
        """Whether the task at position `index` of a rank's list, of global step `step`, is past the limit."""
        return step >= self.step if self.step is not None else self.task is not None and index >= self.task
