"""Whether two ranks of this machine compute as fast at once as one alone: what a pipeline relies on.

Run: .venv/bin/python benchmarks/rank_contention.py [--repeats 6]

The work is one step of the LayerPipe sample network's dominant layer (conv 32 -> 128, 3x3, 32x32) as a
pipeline stage runs it: the forward of 8 micro-batches of 8, then their backwards, on one thread. It runs
in one process alone, then in two processes at once; each prints its milliseconds per step. On a machine
whose cores are independent the two numbers agree, and a balanced pipeline of two ranks can approach
twice the throughput of one; where they share what this work is bound by (memory bandwidth, cache), a
partition that keeps both ranks busy pays for it, and the planner's predictions (which assume
independent ranks) are optimistic by the same factor.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time

import torch
from torch import nn


def step_ms(repeats: int) -> float:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    conv = nn.Conv2d(32, 128, 3, padding=1)
    inputs = [torch.randn(8, 32, 32, 32, requires_grad=True) for _ in range(8)]

    def step() -> None:
        outputs = [conv(x) for x in inputs]
        for output in outputs:
            output.backward(torch.ones_like(output))

    step()
    started = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - started) / repeats * 1e3


def run(repeats: int, queue: multiprocessing.Queue) -> None:
    queue.put(step_ms(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    context = multiprocessing.get_context("spawn")
    for count in (1, 2):
        queue: multiprocessing.Queue = context.Queue()
        processes = [context.Process(target=run, args=(args.repeats, queue)) for _ in range(count)]
        for process in processes:
            process.start()
        results = sorted(queue.get() for _ in processes)
        for process in processes:
            process.join()
        print(f"{count} at once: " + ", ".join(f"{ms:.1f} ms" for ms in results) + " per step each")


if __name__ == "__main__":
    main()
