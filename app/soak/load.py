"""The load other processes put on the machine while one soak segment ran (the benchmarks' LoadMeter,
pipebd_core/bench/conditions.py), with the soak's own processes outside its process tree counted as its own.

LoadMeter counts as "own" only this process and the children it reaped. The soak's PostgreSQL and Redis run
daemonized (not its children), and the ranks and torchrun of a worker it SIGKILLs are orphaned (never reaped
through it): the meter would count their CPU as other processes'. A thread samples, every SAMPLE_S, each process
outside the soak's tree that is the soak's own (its working directory under the soak's folders, or its
PIPEBD_DATA_DIR the service's) and takes their CPU out. What such a process used after its last sample, or a
process that lived less than SAMPLE_S, still counts as other: the figure errs high, never low.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil

from app.soak.history import SegmentLoad
from pipebd_core.bench.conditions import LoadMeter, OutsideSampler, load_without

SAMPLE_S = 0.5


class OwnOutsideTree(OutsideSampler):
    """The soak's own processes that are not its descendants, sampled from its start to `seconds()`."""

    SAMPLE_S = SAMPLE_S

    def __init__(self, folders: list[Path], data_dir: Path) -> None:
        self.folders = [str(folder.resolve()) for folder in folders]
        self.data_dir = str(data_dir.resolve())
        super().__init__()

    def is_own(self, process: psutil.Process) -> bool:
        """The process works in one of the soak's folders, or serves its data directory."""
        try:
            cwd = process.cwd()
            if any(cwd == folder or cwd.startswith(folder + os.sep) for folder in self.folders):
                return True
            return process.environ().get("PIPEBD_DATA_DIR") == self.data_dir
        except psutil.Error:
            return False

    def sampled(self) -> list[psutil.Process]:
        me = os.getpid()
        own = []
        for process in psutil.process_iter():
            if process.pid == me or not self.is_own(process):
                continue
            try:
                if me in {parent.pid for parent in process.parents()}:
                    continue  # a descendant: counted by the load meter once reaped
            except psutil.Error:
                continue
            own.append(process)
        return own


class SegmentMeter:
    """Opened as a segment starts its service, closed once it stopped it: the segment's SegmentLoad."""

    def __init__(self, index: int, folders: list[Path], data_dir: Path) -> None:
        self.index = index
        self.meter = LoadMeter.open()
        self.outside = OwnOutsideTree(folders, data_dir)

    def close(self) -> SegmentLoad:
        outside_s = self.outside.seconds()
        load = load_without(self.meter.load(), outside_s)
        return SegmentLoad(time.time(), self.index, load.wall_s, load.other_cores, load.shared, outside_s)
