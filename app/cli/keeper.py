"""`pipebd up`'s watch over its worker: a worker that dies is started again, after a bounded back-off.

The API keeps serving meanwhile. The dead worker's jobs are settled as soon as anyone looks: the
restarted worker at start-up, and the API's reaper every PIPEBD_REAPER_INTERVAL_S, both see on this
host that its process is gone (app/core/reaper.py): they kill its ranks, record a run that completed
as `succeeded`, and requeue the rest to resume from their checkpoints.
"""

from __future__ import annotations

import subprocess
import time

BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)  # waits before each restart of a worker that keeps dying soon
STEADY_S = 60.0  # a worker that ran this long before it died is restarted after the shortest wait


class WorkerKeeper:
    """Runs `command` as the worker (in its own session), starting it again whenever it exits."""

    def __init__(self, command: list[str]) -> None:
        self.command = command
        self.failures = 0  # deaths in a row, each soon after its start
        self.restarts = 0
        self.restart_at: float | None = None
        self.process = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        self.started = time.monotonic()
        return subprocess.Popen(self.command, start_new_session=True)

    def check(self) -> None:
        """Called about every half second: notice a dead worker, and start it again once its wait is over."""
        if self.process.poll() is None:
            return
        if self.restart_at is None:
            ran = time.monotonic() - self.started
            self.failures = 0 if ran >= STEADY_S else self.failures
            delay = BACKOFF_S[min(self.failures, len(BACKOFF_S) - 1)]
            self.failures += 1
            self.restart_at = time.monotonic() + delay
            print(
                f"pipebd: the worker exited (code {self.process.returncode}) after {ran:.0f} s;"
                f" starting it again in {delay:g} s",
                flush=True,
            )
        elif time.monotonic() >= self.restart_at:
            self.restart_at = None
            self.restarts += 1
            self.process = self._start()
