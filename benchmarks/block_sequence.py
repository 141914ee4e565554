"""A block timed in a loop against the same blocks run one after another (one thread, one process).

The distillation profiler times each block's work (the teacher's forward, the student's step) in a loop of
its own, so the block's weights and activations stay in the caches between trials; a training step runs
the blocks one after another, each evicting the last. The profiler now times that chain too (`chain_s`,
with every rank measuring at once); this drives the same two measurements (profile/blocks.py's
`measure_block` and `measure_chain`) in one process, the other core idle, and prints the chain over the
blocks' sum for a spec's workload at a batch size (ResNet-18's 32-row shard by default):

    .venv/bin/python benchmarks/block_sequence.py examples/resnet18-dsconv.yaml --batch 32

A ratio above 1 is work the blocks timed alone do not show (docs/benchmarks.md, ResNet-18 on the Intel
machines). Scratch evidence for a cost-model question, not a record: run it alone (`quiet`).
"""

from __future__ import annotations

import argparse
import statistics

import torch

from pipebd_core.data.datasets import build_dataset
from pipebd_core.profile.blocks import Trials, measure_block, measure_chain
from pipebd_core.spec import load_spec
from pipebd_core.workloads.probe import block_input, probe_workload
from pipebd_core.workloads.workload import build_workload

TRIALS = 12


def median(trials: Trials) -> float:
    return statistics.median(trials.samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("spec", nargs="?", default="examples/resnet18-dsconv.yaml")
    parser.add_argument("--batch", type=int, default=32, help="rows a block step takes (a shard's, by default)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    spec = load_spec(args.spec)
    workload = build_workload(spec)
    sample = build_dataset(spec)[0][0]
    probe = probe_workload(workload, sample)
    cpu = torch.device("cpu")
    alone = []
    for index in range(len(workload.teacher_blocks)):
        x = block_input(probe.shapes[index], args.batch, sample.dtype if index == 0 else torch.float32, cpu)
        block = measure_block(workload, index, spec, x, TRIALS, cpu)
        alone.append(median(block.teacher) + median(block.student))
    chain = median(measure_chain(workload, spec, probe, args.batch, sample.dtype, TRIALS))
    print(f"blocks {len(alone)}: each in a loop of its own, summed {sum(alone):.4f} s; one after another {chain:.4f} s")
    print(f"ratio {chain / sum(alone):.3f} (per block, ms: {', '.join(f'{a * 1000:.2f}' for a in alone)})")


if __name__ == "__main__":
    main()
