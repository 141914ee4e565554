"""Fault-injection hooks for the failure tests: `PIPEBD_INJECT_FAULT=RANK:STEP` makes that rank raise
before that step."""

from __future__ import annotations

import os

FAULT_ENV = "PIPEBD_INJECT_FAULT"  # "RANK:STEP": that rank raises before that step (failure tests)


def injected_fault_step(rank: int) -> int | None:
    """The step at which this rank must fail, when a test asked for it through FAULT_ENV."""
    target, _, step = os.environ.get(FAULT_ENV, "").partition(":")
    return int(step) if target and int(target) == rank else None
