"""Telemetry: the buffered writer flushes on its own, and every rank line carries the documented fields.

Tier: pure logic, plus one 2-rank gloo run through torchrun.
"""

from __future__ import annotations

import json
import mmap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from pipebd_core.documents.phases import DISTILL, FINETUNE
from pipebd_core.documents.telemetry import DistillLine, EvalLine, read_line
from pipebd_core.rank.telemetry import (
    PHASES,
    PhaseClock,
    TelemetryWriter,
    UtilizationSampler,
    current_memory_bytes,
    nvml_handle,
    nvml_index,
    nvml_utilization_reader,
)
from pipebd_core.rundir import RunDir
from tests.helpers import tiny_spec


def test_writer_flushes_by_itself_while_still_open(tmp_path: Path) -> None:
    path = tmp_path / "metrics" / "rank-0.jsonl"
    writer = TelemetryWriter(path, interval=0.2)
    try:
        line = EvalLine(time=1.0, rank=0, epoch=1, step=1, top1=0.5)
        writer.write(line)
        assert path.read_text() == ""  # buffered, not written on the caller's thread
        deadline = time.monotonic() + 60.0  # its 0.2 s interval; only a writer that never flushes misses this
        while path.read_text() == "" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert read_line(FINETUNE, path.read_text()) == line  # on disk before close(): written by its own thread
    finally:
        writer.close()


def test_phase_clock_attributes_time_to_the_phase_that_ends() -> None:
    clock = PhaseClock(torch.device("cpu"))
    clock.start()
    time.sleep(0.05)
    clock.mark("teacher")
    clock.mark("student")
    phases = clock.phases()
    assert set(PHASES) <= set(phases)
    assert phases["teacher"] >= 0.05 > phases["student"]


def test_every_rank_writes_one_line_per_step_with_all_fields(finished_run: Callable[..., RunDir]) -> None:
    run_dir = finished_run(tiny_spec(schedule={"mode": "tr", "nproc": 2}), until=DISTILL)  # the ranks' lines only
    for rank, blocks in ((0, [0, 1]), (1, [2, 3])):
        lines = [line for line in run_dir.read_telemetry(rank) if isinstance(line, DistillLine)]
        assert [line.step for line in lines] == list(range(8))
        first = lines[0]
        assert first.blocks == blocks and set(first.loss) == set(blocks) and set(first.block_s.student) == set(blocks)
        assert set(first.phases) >= {"data", "recv_wait", "teacher", "student", "optim", "send"}
        assert first.samples == 10 and first.peak_mem > 0 and first.epoch == 0
        assert all(0 < line.cur_mem <= line.peak_mem for line in lines)  # RSS now, never above its peak
        assert all(line.gpu_util is None for line in lines)  # CPU ranks: no NVML utilisation
        assert lines[-1].done == lines[-1].total == 8
        written = [json.loads(text) for text in run_dir.metrics(rank).read_text().splitlines()]
        assert all("gpu_util" not in line and line["format_version"] == 1 for line in written)  # absent, not null
    received = [line.phases["recv_wait"] for line in run_dir.read_telemetry(1) if isinstance(line, DistillLine)]
    loaded = [line.phases["data"] for line in run_dir.read_telemetry(0) if isinstance(line, DistillLine)]
    assert sum(received) > 0 and sum(loaded) > 0


def test_current_memory_is_the_resident_set_now_and_follows_allocations() -> None:
    # A fresh anonymous mapping, every page written: resident memory that did not exist before (a tensor
    # may reuse pages the allocator already holds resident from an earlier test, and RSS would not move).
    cpu = torch.device("cpu")
    size = 64 * 2**20
    before = current_memory_bytes(cpu)
    block = mmap.mmap(-1, size)
    block.write(b"\1" * size)
    during = current_memory_bytes(cpu)
    block.close()  # unmapped: the pages leave the resident set at once
    after = current_memory_bytes(cpu)
    assert during - before > size // 2
    assert during - after > size // 2


class FakeUtilization:
    def __init__(self, gpu: int) -> None:
        self.gpu = gpu


class FakeNvml:
    """pynvml's functions the reader calls, for a machine of 4 GPUs; a handle is the NVML index."""

    class NVMLError(Exception):
        pass

    UUIDS = ("GPU-aaaa", "GPU-bbbb", "GPU-cccc", "GPU-dddd")

    def __init__(self, init_error: bool = False) -> None:
        self.init_error = init_error
        self.reads = 0
        self.value = 40

    def nvmlInit(self) -> None:
        if self.init_error:
            raise self.NVMLError("NVML Shared Library Not Found")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self.UUIDS):
            raise self.NVMLError("Invalid Argument")
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        if uuid not in self.UUIDS:
            raise self.NVMLError("Not Found")
        return self.UUIDS.index(uuid)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> FakeUtilization:
        self.reads += 1
        return FakeUtilization(self.value + handle)


def test_without_nvml_or_a_gpu_there_is_no_utilization() -> None:
    assert nvml_utilization_reader(torch.device("cpu"), FakeNvml()) is None  # CPU ranks never ask NVML
    assert nvml_utilization_reader(torch.device("cuda", 0), FakeNvml(init_error=True)) is None  # nvmlInit raises
    if not torch.cuda.is_available():
        assert nvml_utilization_reader(torch.device("cuda", 0)) is None  # the real pynvml: no driver, no GPU
    sampler = UtilizationSampler(None)
    assert sampler.sample() is None and sampler.sample() is None


def test_utilization_is_read_at_most_every_interval_and_reused_between() -> None:
    nvml, now = FakeNvml(), [100.0]
    sampler = UtilizationSampler(lambda: nvml.nvmlDeviceGetUtilizationRates(0).gpu, interval=0.5, clock=lambda: now[0])
    assert sampler.sample() == 40 and nvml.reads == 1
    nvml.value = 90
    for step in range(10):  # steps 40 ms apart: the same reading
        now[0] += 0.04
        assert sampler.sample() == 40, step
    assert nvml.reads == 1
    now[0] += 0.2  # 0.6 s after the first read
    assert sampler.sample() == 90 and nvml.reads == 2
    now[0] += 0.49
    assert sampler.sample() == 90 and nvml.reads == 2


def test_a_failing_read_gives_no_value_and_stops_reading() -> None:
    calls = []

    def read() -> int:
        calls.append(1)
        raise RuntimeError("NVML went away")

    now = [0.0]
    sampler = UtilizationSampler(read, interval=0.5, clock=lambda: now[0])
    assert sampler.sample() is None
    now[0] += 5
    assert sampler.sample() is None and len(calls) == 1


def test_a_gpu_rank_reads_its_own_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    nvml = FakeNvml()
    read = nvml_utilization_reader(torch.device("cuda", 1), nvml, uuid="dddd")  # torch's UUIDs lack "GPU-"
    assert read is not None and read() == 40 + 3
    unknown = nvml_utilization_reader(torch.device("cuda", 1), nvml, uuid="ffff")  # by CUDA_VISIBLE_DEVICES
    assert unknown is not None and unknown() == 40 + 3
    assert nvml_utilization_reader(torch.device("cuda", 2), nvml, uuid="") is None  # not a visible device


def test_cuda_indices_map_through_cuda_visible_devices_to_nvml() -> None:
    nvml = FakeNvml()
    assert nvml_handle(nvml, 0, "cccc", None) == 2 and nvml_handle(nvml, 0, "GPU-bbbb", "3") == 1
    assert nvml_handle(nvml, 0, "", "3,1") == 3 and nvml_handle(nvml, 1, "", None) == 1
    assert nvml_index(1, None) == 1 and nvml_index(1, "") == 1
    assert nvml_index(0, "3,1") == 3 and nvml_index(1, " 3, 1 ") == 1
    with pytest.raises(ValueError):
        nvml_index(2, "3,1")
    with pytest.raises(ValueError):
        nvml_index(0, "GPU-8e3c1b1d")
