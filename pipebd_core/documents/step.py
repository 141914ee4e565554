"""step/request.json and step/answer.json: a launch step run in a child process (pipebd_core/job/isolated.py
writes the request and reads the answer; pipebd_core/job/steps.py reads the one and writes the other)."""

from __future__ import annotations

from typing import Any, Literal

from pipebd_core.documents.base import Document

StepName = Literal["preflight", "plan", "plan_finetune", "replan"]


class StepRequest(Document):
    """Which step to run, on which spec (as `Spec.model_dump(mode="json")` gives it) and, for a phase, in
    which run directory."""

    NAME = "step/request.json"
    VERSION = 1

    step: StepName
    spec: dict[str, Any]
    run_dir: str | None = None


class StepAnswer(Document):
    """What the step raised (its exception's class name and message), or what it gave back (`result`: a
    JSON document, for the steps that return one) where it succeeded."""

    NAME = "step/answer.json"
    VERSION = 1

    error: str | None = None
    message: str = ""
    result: dict[str, Any] | None = None
