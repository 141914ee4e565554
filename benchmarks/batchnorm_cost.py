"""What synchronised batch statistics cost: the same runs with cross-rank and with shard-local BatchNorm.

Run: .venv/bin/python benchmarks/batchnorm_cost.py [--steps 6] [--repeats 2] [--students-only]

The VGG-16 example (`examples/vgg16-dsconv.yaml`: 13 depthwise-separable student blocks, 26 BatchNorm
layers, batch 64 of 32x32) runs in the three layouts that split a student's rows: `dp` and `ir` on 2
ranks, and `hybrid` on 3 ranks with blocks 0-8 replicated on two of them (32 rows each) and blocks
9-12 on the third. Each runs with synchronised statistics (what PipeBD does) and with shard-local
ones (the benchmark knob students.LOCAL_BATCHNORM_ENV, passed to the ranks only by this script),
the two alternating ABBA over the repeats, each layout's pair back to back. Step times come from the
ranks' own telemetry, as in `pipebd bench` (pipelines at steady state, dp over its whole span).

First, and alone with --students-only, the layers' own work: the process CPU time of every student
block's forward and backward on 32 rows (a rank's share in dp and ir) in this one process, with
plain BatchNorm and with the cross-rank one in a group of one rank (all of its computation and its
collectives, no peer to wait for), alternating.
"""

from __future__ import annotations

import argparse
import copy
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipebd_core.bench.arms import timed_step_s
from pipebd_core.bench.distill import read_metrics
from pipebd_core.distill.plan import Plan
from pipebd_core.job.launch import prepare_run, start_ranks
from pipebd_core.rank import batchnorm
from pipebd_core.rank.batchnorm import LOCAL_BATCHNORM_ENV
from pipebd_core.spec import Spec, load_spec
from pipebd_core.workloads.workload import build_workload

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "vgg16-dsconv.yaml"
LAYOUTS: dict[str, dict[str, Any]] = {
    "dp": {"mode": "dp", "nproc": 2, "stages": None},
    "ir": {"mode": "ir", "nproc": 2, "stages": None},
    "hybrid": {
        "mode": "hybrid",
        "nproc": 3,
        "stages": [{"start": 0, "stop": 9, "replicas": 2}, {"start": 9, "stop": 13, "replicas": 1}],
    },
}
ARMS = {"synchronised": {}, "shard-local": {LOCAL_BATCHNORM_ENV: "1"}}


def layout_spec(spec: Spec, layout: dict[str, Any], steps: int) -> Spec:
    """The example with this layout, exactly `steps` optimiser steps per block, no profiling."""
    document = spec.model_dump(mode="json")
    document["schedule"].update({**layout, "profile": False})
    document["train"].update({"max_steps": steps, "epochs": 1})
    return Spec.model_validate(document)


def step_seconds(spec: Spec, env: dict[str, str], out: Path) -> float:
    """One run's seconds per global step, from its telemetry; the run directory is removed afterwards."""
    run_dir = prepare_run(spec, out)
    code = start_ranks(spec, run_dir, env).wait()
    if code != 0:
        errors = run_dir.rank_errors()
        raise RuntimeError(f"{spec.schedule.mode} exited {code}: {errors[0].message if errors else 'no rank error'}")
    plan = Plan.from_document(run_dir.load_plan())
    seconds = statistics.fmean(timed_step_s(read_metrics(run_dir, plan.nproc)).values())
    shutil.rmtree(out, ignore_errors=True)
    return seconds


def channels_normalised(spec: Spec) -> tuple[int, int]:
    """(BatchNorm layers, their channels in all) over the example's students."""
    norms = [
        m for student in build_workload(spec).student_blocks for m in student.modules() if isinstance(m, _BatchNorm)
    ]
    return len(norms), sum(m.num_features for m in norms)


def students_step_cpu_s(students: list[nn.Module], pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Process CPU seconds of one forward and backward of every student block against its teacher's output."""
    started = time.process_time()
    for student, (inputs, target) in zip(students, pairs, strict=True):
        F.mse_loss(student(inputs), target).backward()
    return time.process_time() - started


def teacher_pairs(teachers: list[nn.Module], x: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input, output) of every teacher block, from the batch x."""
    pairs = []
    with torch.no_grad():
        for teacher in teachers:
            pairs.append((x, teacher(x)))
            x = pairs[-1][1]
    return pairs


def students_compute(example: Spec, rows: int = 32, rounds: int = 12) -> dict[str, list[float]]:
    """CPU seconds per round of the example's students with plain and with cross-rank BatchNorm, alternating."""
    torch.set_num_threads(1)
    workload = build_workload(example)
    pairs = teacher_pairs(
        workload.teacher_blocks, torch.randn(rows, 3, example.data.image_size, example.data.image_size)
    )
    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1)
        try:
            world = dist.group.WORLD
            assert world is not None, "the process group was just initialised"
            arms = {
                "plain": [copy.deepcopy(s) for s in workload.student_blocks],
                "cross-rank": [batchnorm.convert(copy.deepcopy(s), world) for s in workload.student_blocks],
            }
            times: dict[str, list[float]] = {arm: [] for arm in arms}
            for round_ in range(rounds + 1):  # round 0 warms up
                for arm in list(arms) if round_ % 2 == 0 else list(reversed(arms)):
                    seconds = students_step_cpu_s(arms[arm], pairs)
                    if round_ > 0:
                        times[arm].append(seconds)
        finally:
            dist.destroy_process_group()
    return times


def measure(example: Spec, steps: int, repeats: int) -> dict[str, dict[str, list[float]]]:
    """Seconds per step of every layout and arm, per repeat: arms ABBA, each layout's pair back to back."""
    times: dict[str, dict[str, list[float]]] = {name: {arm: [] for arm in ARMS} for name in LAYOUTS}
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(repeats):
            order = list(ARMS) if repeat % 2 == 0 else list(reversed(ARMS))
            for name, layout in LAYOUTS.items():
                spec = layout_spec(example, layout, steps)
                for arm in order:
                    seconds = step_seconds(spec, ARMS[arm], Path(folder) / f"{name}-{arm}-{repeat}")
                    times[name][arm].append(seconds)
                    print(f"repeat {repeat} {name:7} {arm:13} {seconds:.3f} s/step", flush=True)
    return times


def report_students(times: dict[str, list[float]]) -> None:
    plain, cross = statistics.median(times["plain"]), statistics.median(times["cross-rank"])
    print(f"students' forward and backward on 32 rows, one process, CPU time (median of {len(times['plain'])}):")
    print(f"plain BatchNorm {plain * 1e3:.0f} ms, cross-rank BatchNorm {cross * 1e3:.0f} ms: {cross / plain:.3f}x\n")


def report(times: dict[str, dict[str, list[float]]], example: Spec) -> None:
    layers, channels = channels_normalised(example)
    print(f"\n{layers} BatchNorm layers, {channels} channels: per step and rank each layer all-gathers 2C+1")
    print(f"and all-reduces 2C float64 values, {(4 * channels + layers) * 8 / 1024:.0f} KiB in all")
    print(f"{'layout':8} {'synchronised s/step':>24} {'shard-local s/step':>24} {'ratio':>7}")
    for name, arms in times.items():
        synced, local = statistics.median(arms["synchronised"]), statistics.median(arms["shard-local"])
        runs = {arm: ", ".join(f"{t:.3f}" for t in values) for arm, values in arms.items()}
        print(
            f"{name:8} {synced:8.3f} ({runs['synchronised']:>13}) {local:8.3f} ({runs['shard-local']:>13})"
            f" {synced / local:6.3f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="optimiser steps per block and run (at most 8)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--students-only", action="store_true", help="only the layers' work in this process")
    args = parser.parse_args()
    example = load_spec(EXAMPLE)
    report_students(students_compute(example))
    if not args.students_only:
        report(measure(example, args.steps, args.repeats), example)


if __name__ == "__main__":
    main()
