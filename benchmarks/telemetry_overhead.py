"""What the per-step telemetry costs a rank: the same training steps with and without it, side by side.

Run: .venv/bin/python benchmarks/telemetry_overhead.py [--steps 400] [--repeats 5]

The steps are those of the bundled tiny example (`examples/tiny-custom.yaml`: 4 conv blocks, batch
12 of 8x8 images), the smallest work per step we ship, so the telemetry's share of a step is at its
largest here. Each "with" step does what a rank does for its line: phase marks, current and peak
memory, the (rate-limited) GPU utilisation sample, the record, and the buffered writer (flushed to
disk by its thread every second). Runs alternate (ABBA) with and without, on one thread, and the medians
are compared. On CUDA the telemetry also reads each step's loss and phase timings back from the GPU;
that wait is not measured here (this benchmark runs on the CPU).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipebd_core.documents.telemetry import BlockSeconds, DistillLine
from pipebd_core.rank.telemetry import (
    PhaseClock,
    TelemetryWriter,
    UtilizationSampler,
    current_memory_bytes,
    nvml_utilization_reader,
    peak_memory_bytes,
)
from pipebd_core.workloads.tiny import make_blocks

CPU = torch.device("cpu")


def train_steps(steps: int, writer: TelemetryWriter | None) -> float:
    """Seconds per step of `steps` blockwise training steps, writing a telemetry line per step if `writer`."""
    torch.manual_seed(0)
    teachers, students = make_blocks(num_blocks=4, channels=8)
    optimisers = [torch.optim.SGD(s.parameters(), lr=0.05, momentum=0.9) for s in students]
    clock, gpu = PhaseClock(CPU), UtilizationSampler(nvml_utilization_reader(CPU))
    x0 = torch.randn(12, 3, 8, 8)
    started = time.perf_counter()
    for step in range(steps):
        clock.start()
        x, losses = x0, {}
        for block, (teacher, student, optimiser) in enumerate(zip(teachers, students, optimisers, strict=True)):
            with torch.no_grad():
                target = teacher(x)
            clock.mark("teacher")
            loss = F.mse_loss(student(x), target)
            optimiser.zero_grad()
            loss.backward()
            clock.mark("student")
            optimiser.step()
            clock.mark("optim")
            losses[block], x = float(loss.detach()), target
        if writer is not None:
            writer.write(telemetry_line(step, losses, clock, gpu))
    return (time.perf_counter() - started) / steps


def telemetry_line(step: int, losses: dict[int, float], clock: PhaseClock, gpu: UtilizationSampler) -> DistillLine:
    """The line a rank writes (runtime.Trainer._record), built from the same parts."""
    memory = current_memory_bytes(CPU)
    phases = clock.phases()
    return DistillLine(
        time=time.time(),
        rank=0,
        epoch=0,
        step=step,
        round="weights",
        blocks=[0, 1, 2, 3],
        loss=losses,
        phases=phases,
        block_s=BlockSeconds(
            teacher=dict(enumerate(clock.laps("teacher"))), student=dict(enumerate(clock.laps("student")))
        ),
        samples=12,
        peak_mem=max(peak_memory_bytes(CPU), memory),
        cur_mem=memory,
        done=step + 1,
        total=step + 1,
        gpu_util=gpu.sample(),
    )


def cost_of_one_line(lines: int = 5000) -> float:
    """Seconds to build and buffer one line, timed in a tight loop (no training around it)."""
    clock, gpu = PhaseClock(CPU), UtilizationSampler(nvml_utilization_reader(CPU))
    clock.start()
    for _ in range(4):  # four blocks, as in train_steps
        clock.mark("teacher")
        clock.mark("student")
    losses = dict.fromkeys(range(4), 0.1)
    with tempfile.TemporaryDirectory() as folder:
        writer = TelemetryWriter(Path(folder) / "rank-0.jsonl")
        started = time.perf_counter()
        for step in range(lines):
            writer.write(telemetry_line(step, losses, clock, gpu))
        elapsed = time.perf_counter() - started
        writer.close()
    return elapsed / lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as a rank runs on the CPU
    train_steps(20, None)  # warm-up
    without, with_telemetry = [], []
    with tempfile.TemporaryDirectory() as folder:
        writer = TelemetryWriter(Path(folder) / "rank-0.jsonl")
        try:
            for repeat in range(args.repeats):  # ABBA: neither arm always runs first
                for arm in (0, 1) if repeat % 2 == 0 else (1, 0):
                    if arm == 0:
                        without.append(train_steps(args.steps, None))
                    else:
                        with_telemetry.append(train_steps(args.steps, writer))
        finally:
            writer.close()
        lines = sum(1 for _ in (Path(folder) / "rank-0.jsonl").open())
    base, telemetry = statistics.median(without), statistics.median(with_telemetry)
    line_cost = cost_of_one_line()
    print(f"steps per run {args.steps}, runs {args.repeats} each, alternating; {lines} lines written")
    for label, value, runs in (("without telemetry", base, without), ("with telemetry", telemetry, with_telemetry)):
        print(f"{label:<18} {value * 1e3:8.3f} ms/step  (runs: {', '.join(f'{t * 1e3:.3f}' for t in runs)})")
    print(f"overhead           {(telemetry - base) * 1e6:8.1f} us/step = {telemetry / base - 1:+.2%} of the tiny step")
    print(f"one line alone     {line_cost * 1e6:8.1f} us (record and buffered write, timed on their own)")


if __name__ == "__main__":
    main()
