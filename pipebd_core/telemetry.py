"""Per-rank telemetry: phase timing, peak memory, and a buffered JSONL writer.

One line per task per rank in `metrics/rank-<r>.jsonl`. Lines are buffered in memory and flushed
by a background thread at least once a second, so training never waits on the disk.
"""

from __future__ import annotations

import json
import resource
import threading
import time
from pathlib import Path
from typing import Any

import torch

PHASES = ("data", "recv_wait", "teacher", "send", "student", "allreduce", "barrier", "optim")


class PhaseClock:
    """Splits a step into named phases; on CUDA it times with events, on CPU with the wall clock."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._marks: list[tuple[str, Any]] = []

    def start(self) -> None:
        self._marks = [("", self._now())]

    def mark(self, phase: str) -> None:
        """Close the phase called `phase` now."""
        self._marks.append((phase, self._now()))

    def phases(self) -> dict[str, float]:
        """Seconds per phase since `start`; waits for the GPU on CUDA."""
        durations = dict.fromkeys(PHASES, 0.0)
        if self.cuda:
            self._marks[-1][1].synchronize()
        for (_, before), (phase, after) in zip(self._marks, self._marks[1:], strict=False):
            durations[phase] = durations.get(phase, 0.0) + self._elapsed(before, after)
        return durations

    def _now(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _elapsed(self, before: Any, after: Any) -> float:
        if self.cuda:
            return float(before.elapsed_time(after)) / 1000.0
        return float(after - before)


def peak_memory_bytes(device: torch.device) -> int:
    """CUDA max allocated on GPU, peak resident set size of the process on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class TelemetryWriter:
    """Appends JSON lines to one file, flushing from a background thread every `interval` seconds."""

    def __init__(self, path: Path, interval: float = 1.0) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")
        self._buffer: list[str] = []
        self._lock = threading.Lock()  # guards the buffer
        self._file_lock = threading.Lock()  # keeps flushes from interleaving
        self._closed = threading.Event()
        self._interval = interval
        self._thread = threading.Thread(target=self._flush_periodically, name="telemetry", daemon=True)
        self._thread.start()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            self._buffer.append(line)

    def flush(self) -> None:
        with self._file_lock:
            with self._lock:
                lines, self._buffer = self._buffer, []
            if lines:
                self._file.write("".join(lines))
                self._file.flush()

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._thread.join()
        self.flush()
        self._file.close()

    def _flush_periodically(self) -> None:
        while not self._closed.wait(self._interval):
            self.flush()


def append_event(path: Path, event: str, **fields: Any) -> None:
    """Append one lifecycle event to events.jsonl (single write, so concurrent ranks do not interleave)."""
    record = {"time": time.time(), "event": event, **fields}
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, separators=(",", ":")) + "\n")
