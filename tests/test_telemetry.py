"""Telemetry: the buffered writer flushes on its own, and every rank line carries the documented fields.

Tier: pure logic, plus one 2-rank gloo run through torchrun.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec
from pipebd_core.telemetry import PHASES, PhaseClock, TelemetryWriter
from tests.helpers import tiny_spec


def test_writer_flushes_within_a_second_without_being_closed(tmp_path: Path) -> None:
    path = tmp_path / "metrics" / "rank-0.jsonl"
    writer = TelemetryWriter(path, interval=0.2)
    try:
        writer.write({"step": 1})
        assert path.read_text() == ""  # buffered, not written on the caller's thread
        deadline = time.monotonic() + 1.0
        while path.read_text() == "" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert json.loads(path.read_text()) == {"step": 1}
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


def test_every_rank_writes_one_line_per_step_with_all_fields(finished_run: Callable[[Spec], RunDir]) -> None:
    run_dir = finished_run(tiny_spec(schedule={"mode": "tr", "nproc": 2}))  # shared with test_equivalence
    for rank, blocks in ((0, [0, 1]), (1, [2, 3])):
        lines = [json.loads(line) for line in run_dir.metrics(rank).read_text().splitlines()]
        assert [line["step"] for line in lines] == list(range(8))
        first = lines[0]
        assert first["blocks"] == blocks and set(first["loss"]) == {str(b) for b in blocks}
        assert set(first["phases"]) >= {"data", "recv_wait", "teacher", "student", "optim", "send"}
        assert first["samples"] == 10 and first["peak_mem"] > 0 and first["epoch"] == 0
        assert lines[-1]["done"] == lines[-1]["total"] == 8
    received = [json.loads(line)["phases"]["recv_wait"] for line in run_dir.metrics(1).read_text().splitlines()]
    loaded = [json.loads(line)["phases"]["data"] for line in run_dir.metrics(0).read_text().splitlines()]
    assert sum(received) > 0 and sum(loaded) > 0
