"""A job's states and their groups, in one place: the lifecycle (app/core/lifecycle.py) moves jobs between
them; a sweep's state (app/core/sweeps.py) and its events (app/core/sweep_events.py) are read from them."""

from __future__ import annotations

from typing import Literal, get_args

JobState = Literal[
    "queued", "starting", "running", "pausing", "paused", "cancelling", "succeeded", "failed", "cancelled"
]
STATES: tuple[str, ...] = get_args(JobState)  # in lifecycle order
QUEUED, STARTING, RUNNING, PAUSING, PAUSED, CANCELLING, SUCCEEDED, FAILED, CANCELLED = STATES
FINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})  # ended (failed and cancelled ones may be resumed)
ACTIVE = frozenset({STARTING, RUNNING, PAUSING, CANCELLING})  # a worker owns the job and may hold processes
RESUMABLE = frozenset({FAILED, CANCELLED, PAUSED})  # POST .../resume puts these back in the queue
AT_REST = FINAL | {PAUSED}  # no worker holds it and none will take it: it may be deleted
