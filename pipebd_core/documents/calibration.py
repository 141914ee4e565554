"""Calibration (calibration.json, and `calibration` in a cached block profile): the block times training
measured, next to what the profile said, as ratios the cost model applies (pipebd_core/planning/
planning/distill_calibration.py computes it; the cost model, re-planning and the job page read it)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from pipebd_core.documents.base import Document


class BlockCalibration(BaseModel):
    """One block: measured / profiled for its teacher and its student (None: training has not run it)."""

    model_config = ConfigDict(extra="forbid")

    teacher: float | None = None  # ratio: above 1, the block ran slower than profiled
    student: float | None = None
    teacher_s: float | None = None  # seconds per task training measured
    student_s: float | None = None
    batch: int | None = None  # the per-replica batch it was measured at
    tasks: int | None = None  # how many tasks the ratio is over


class CalibrationSource(BaseModel):
    """Where a calibration came from: the run, the steps it measured, the stages that ran them, when."""

    model_config = ConfigDict(extra="forbid")

    run: str
    steps: list[int]  # [first, last]
    stages: list[dict[str, Any]] | None = None  # plan.json's stages while they were measured
    at: float  # when it was computed (seconds since the epoch)


class Calibration(Document):
    """Per block ratios, data loading's and the all-reduces', what a task costs beyond them, the step
    time measured and where it all came from."""

    NAME = "calibration"
    VERSION = 1

    blocks: list[BlockCalibration]
    data: float = 1.0
    allreduce: float = 1.0
    task_overhead_s: float = 0.0
    measured_step_s: float | None = None  # the pipeline's pace (the slowest rank's), None with too few lines
    source: CalibrationSource
