"""SSE followers for the soak: each follows one job's event stream in a thread of its own, hangs up after a
random number of events and reconnects with Last-Event-ID, until the soak stops it; it keeps the id of every
event it was sent, in order, for the followers_saw_every_event invariant."""

from __future__ import annotations

import random
import threading

import httpx

from app.cli.client import parse_events

RECONNECT_PAUSE_S = (0.05, 1.0)  # how long a follower stays away before it reconnects
FINAL_READ_TRIES = 5  # the last read (to the stream's end) is tried this often


class SseFollower:
    """Follows until `stop`: a job at rest ends its stream, but may be resumed, so the follower comes back until
    the soak has drained; then it reads once more, to the end, without hanging up."""

    def __init__(self, name: str, url: str, job_id: int, seed: int) -> None:
        self.name, self.url, self.job_id = name, url, job_id
        self.random = random.Random(seed)
        self.seen: list[int] = []
        self.reconnects = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"soak-{name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float = 60) -> None:
        self.stopping.set()
        self.thread.join(timeout)

    def _run(self) -> None:
        while not self.stopping.is_set():
            self._connect(hang_up_after=self.random.randint(1, 6))
            self.reconnects += 1
            self.stopping.wait(self.random.uniform(*RECONNECT_PAUSE_S))
        for _ in range(FINAL_READ_TRIES):
            if self._connect(hang_up_after=None):
                return

    def _connect(self, hang_up_after: int | None) -> bool:
        """One connection, from the last event seen; True when it read to the stream's `end`."""
        headers = {"Last-Event-ID": str(self.seen[-1])} if self.seen else {}
        taken = 0
        try:
            path = f"{self.url}/api/v1/jobs/{self.job_id}/events"
            with httpx.stream("GET", path, headers=headers, timeout=httpx.Timeout(10, read=30)) as response:
                if response.status_code != 200:
                    return False
                for event in parse_events(response.iter_lines()):
                    if event.name == "end":
                        return True
                    if event.id is not None:
                        self.seen.append(event.id)
                        taken += 1
                    if hang_up_after is not None and (taken >= hang_up_after or self.stopping.is_set()):
                        return False  # hang up mid-stream
        except (httpx.TransportError, httpx.StreamError):
            return False
        return False
