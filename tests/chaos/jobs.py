"""The chaos tier's jobs: tiny specs slowed down by their data set (each sample sleeps), so a fault can
land mid-distillation, and the reference weights of their uninterrupted runs."""

from __future__ import annotations

from typing import Any

from tests.service.factories import tiny_job
from tests.service.slow_data import FACTORY as SLOW_DATA

DELAY_S = 0.01  # per sample: a 10-sample batch takes 0.1 s to load, so 24 steps last a few seconds
HYBRID_STAGES = [{"start": 0, "stop": 1, "replicas": 2}, {"start": 1, "stop": 4, "replicas": 1}]


def slow_job(name: str, **schedule: Any) -> dict[str, Any]:
    """A tiny job of 24 steps (6 epochs of 4) whose batches load slowly, checkpointed every 2 steps."""
    data = {"dataset": "custom", "factory": SLOW_DATA, "options": {"delay_s": DELAY_S}, "batch_size": 10}
    return tiny_job(
        name,
        data=data,
        train={"epochs": 6, "checkpoint_every": 2},
        schedule={"mode": "tr_dpu", "nproc": 2, "profile": False, **schedule},
    )


def hybrid_job(name: str) -> dict[str, Any]:
    return slow_job(name, mode="hybrid", nproc=3, stages=HYBRID_STAGES)
