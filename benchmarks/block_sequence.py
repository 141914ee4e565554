"""A block timed in a loop against the same blocks run one after another (one thread, one process).

The distillation profiler times each block's work (the teacher's forward, the student's step) in a loop of
its own, so the block's weights and activations stay in the caches between trials; a training step runs
the blocks one after another, each evicting the last. This prints the ratio of the chain's median step to
the sum of the blocks' medians, for a spec's workload at a batch size (ResNet-18's by default):

    .venv/bin/python benchmarks/block_sequence.py examples/resnet18-dsconv.yaml --batch 32

A ratio above 1 is work the profile does not see (docs/benchmarks.md, ResNet-18 on the Intel machines).
Scratch evidence for a cost-model question, not a record: run it alone (`quiet`).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from pipebd_core.spec import load_spec
from pipebd_core.workloads.workload import Workload, build_workload

WARMUP, TRIALS = 2, 12


def block_steps(workload: Workload, batch: int, sample_shape: list[int]) -> list[Callable[[], None]]:
    """Each block's distillation work on a fixed input: the teacher's forward, the student's MSE step."""
    inputs, x = [], torch.randn(batch, *sample_shape)
    with torch.no_grad():
        for teacher in workload.teacher_blocks:
            inputs.append(x)
            x = teacher(x)
    steps = []
    for teacher, student, given in zip(workload.teacher_blocks, workload.student_blocks, inputs, strict=True):
        optimiser = torch.optim.SGD(student.parameters(), lr=0.01)

        def step(
            teacher: torch.nn.Module = teacher,
            student: torch.nn.Module = student,
            given: torch.Tensor = given,
            optimiser: torch.optim.Optimizer = optimiser,
        ) -> None:
            with torch.no_grad():
                target = teacher(given)
            loss = torch.nn.functional.mse_loss(student(given), target)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()

        steps.append(step)
    return steps


def median_s(fn: Callable[[], None]) -> float:
    times = []
    for _ in range(WARMUP + TRIALS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times[WARMUP:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", default="examples/resnet18-dsconv.yaml")
    parser.add_argument("--batch", type=int, default=32, help="rows a block step takes (a shard's, by default)")
    parser.add_argument("--shape", default="3,32,32", help="one sample's shape entering the first block")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    steps = block_steps(build_workload(load_spec(args.spec)), args.batch, [int(d) for d in args.shape.split(",")])
    for step in steps:  # warm every block once
        step()
    alone = [median_s(step) for step in steps]

    def one_after_another() -> None:
        for step in steps:
            step()

    chain = median_s(one_after_another)
    print(f"blocks {len(steps)}: each in a loop of its own, summed {sum(alone):.4f} s; one after another {chain:.4f} s")
    print(f"ratio {chain / sum(alone):.3f} (per block, ms: {', '.join(f'{a * 1000:.2f}' for a in alone)})")


if __name__ == "__main__":
    main()
