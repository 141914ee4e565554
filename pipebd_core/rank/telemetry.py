"""Per-rank telemetry: phase timing, current and peak memory, GPU utilisation, and a buffered JSONL writer.

One line (pipebd_core/documents/telemetry.py) per task per rank in `metrics/<phase>/rank-<r>.jsonl`.
Lines are buffered in memory and flushed by a background thread at least once a second, so training
never waits on the disk.
"""

from __future__ import annotations

import importlib
import os
import resource
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import torch

from pipebd_core.documents.telemetry import TelemetryLine, to_line
from pipebd_core.rundir import STEP_PHASES as PHASES


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

    def laps(self, phase: str) -> list[float]:
        """Seconds of each closing of `phase`, in order (after `phases`, which waits for the GPU)."""
        pairs = zip(self._marks, self._marks[1:], strict=False)
        return [self._elapsed(before, after) for (_, before), (name, after) in pairs if name == phase]

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


class _ResidentSetSize:
    """The process's resident set size now. On Linux one pread of /proc/self/statm on a file kept open
    (a few microseconds); elsewhere psutil, which opens and parses a file per call (tens of them)."""

    def __init__(self) -> None:
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        try:
            self._statm: int | None = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._statm = None
        self._process = psutil.Process()

    def __call__(self) -> int:
        if self._statm is not None:
            return int(os.pread(self._statm, 128, 0).split()[1]) * self._page
        return int(self._process.memory_info().rss)


_RSS: _ResidentSetSize | None = None


def current_memory_bytes(device: torch.device) -> int:
    """CUDA memory allocated now on GPU, resident set size of the process now on CPU."""
    global _RSS
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    if _RSS is None:
        _RSS = _ResidentSetSize()
    return _RSS()


def nvml_index(cuda_index: int, visible: str | None) -> int:
    """The NVML index of CUDA device `cuda_index`: NVML counts every GPU of the machine, CUDA only the
    ones CUDA_VISIBLE_DEVICES lists (in its order). Entries that are not integers (UUIDs) cannot be
    mapped here: ValueError."""
    if not visible or not visible.strip():
        return cuda_index
    entries = [entry.strip() for entry in visible.split(",")]
    if cuda_index >= len(entries):
        raise ValueError(f"CUDA device {cuda_index} is not among CUDA_VISIBLE_DEVICES={visible}")
    return int(entries[cuda_index])


def nvml_handle(nvml: Any, cuda_index: int, uuid: str, visible: str | None) -> Any:
    """NVML's handle of CUDA device `cuda_index`: by the UUID CUDA reports for it (right whatever
    CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER say), else by its index mapped through `visible`
    (CUDA_VISIBLE_DEVICES)."""
    if uuid:
        try:
            return nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
        except nvml.NVMLError:
            pass
    return nvml.nvmlDeviceGetHandleByIndex(nvml_index(cuda_index, visible))


def nvml_utilization_reader(
    device: torch.device, nvml: Any = None, uuid: str | None = None
) -> Callable[[], int] | None:
    """A function that reads the GPU utilisation (percent of the last sample period with a kernel running)
    of `device` from NVML; None where NVML cannot say: a CPU device, nvidia-ml-py missing, no driver,
    a device (a MIG slice) without utilisation. `nvml` is the pynvml module (imported here when None);
    `uuid` the device's CUDA UUID (asked of torch when None)."""
    if device.type != "cuda":
        return None
    try:
        if nvml is None:
            nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
        index = device.index if device.index is not None else torch.cuda.current_device()
        if uuid is None:
            uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
        handle = nvml_handle(nvml, index, uuid, os.environ.get("CUDA_VISIBLE_DEVICES"))
        nvml.nvmlDeviceGetUtilizationRates(handle)  # raises here if this device cannot report it
    except Exception:  # ImportError, NVMLError (no library, no driver, not supported), no such device
        return None
    return lambda: int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)


class UtilizationSampler:
    """Reads a slow gauge (NVML GPU utilisation) at most once every `interval` seconds and hands back the
    last value in between, so that asking on every step costs nothing. No reader: always None. A read
    that fails gives None, and the sampler stops reading (NVML went away)."""

    def __init__(
        self,
        read: Callable[[], int] | None,
        interval: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read, self._interval, self._clock = read, interval, clock
        self._value: int | None = None
        self._at: float | None = None

    def sample(self) -> int | None:
        if self._read is None:
            return None
        now = self._clock()
        if self._at is None or now - self._at >= self._interval:
            self._at = now
            try:
                self._value = self._read()
            except Exception:
                self._read, self._value = None, None
        return self._value


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

    def write(self, line: TelemetryLine) -> None:
        text = to_line(line)
        with self._lock:
            self._buffer.append(text)

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
