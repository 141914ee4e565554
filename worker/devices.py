"""What a worker offers: its device count (advertised through the queues it consumes) and, when it
runs several jobs at once on GPUs, which GPUs each job gets."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from pipebd_core import devices


def detect_devices() -> int:
    """GPUs when CUDA is present, otherwise CPU cores (each CPU rank is a single-threaded process); asked
    without importing torch where there are no GPUs (pipebd_core/devices.py)."""
    return devices.cuda_count() or max(1, os.cpu_count() or 1)


class DevicePool:
    """Hands out GPU indices to concurrent jobs; on CPU there is nothing to hand out."""

    def __init__(self, count: int, cuda: bool) -> None:
        self.cuda, self.count = cuda, count
        self.free = list(range(count))
        self.changed = threading.Condition()

    @contextmanager
    def take(self, wanted: int) -> Iterator[dict[str, str]]:
        """Wait for `wanted` free GPUs; yields the environment that pins the job to them."""
        if not self.cuda:
            yield {}
            return
        with self.changed:
            self.changed.wait_for(lambda: len(self.free) >= wanted)
            taken, self.free = self.free[:wanted], self.free[wanted:]
        try:
            yield {"CUDA_VISIBLE_DEVICES": ",".join(str(index) for index in taken)}
        finally:
            with self.changed:
                self.free = sorted(self.free + taken)
                self.changed.notify_all()
