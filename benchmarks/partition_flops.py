"""The partitioners on FLOP counts, the way the LayerPipe paper simulates work: no profile, no machine.

Run: .venv/bin/python benchmarks/partition_flops.py

Every layer's forward, delta and G cost its forward FLOPs (the first layer has no delta, a layer without
weights no G), and every Conv2d or Linear delta after the first layer is movable. Prints, for the
paper's four-layer sample network (examples/layerpipe-sample.yaml) and the VGG-16 compressed student
(examples/vgg16-dsconv.yaml) at 2 and 3 stages, each partitioner's stages, moved shares and stage work,
and how much faster layerpipe's slowest stage is than pipedream's. What the planner does on measured
costs is in `pipebd bench --phase finetune --partitioners ...` (docs/benchmarks.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipebd_core.planning.finetune_partition import PARTITIONER_FUNCTIONS, LayerCost, slowest, stage_work
from pipebd_core.rank.channels import split_channels
from pipebd_core.rank.network import Network, as_network, build_network
from pipebd_core.spec import load_spec
from pipebd_core.workloads.flops import count_flops
from pipebd_core.workloads.layerpipe_sample import make_network

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def flop_costs(network: Network, image_size: int) -> list[LayerCost]:
    x, costs = torch.randn(1, 3, image_size, image_size), []
    network.model.eval()
    with torch.no_grad():
        for index, layer in enumerate(network.layers):
            x, flops = count_flops(layer, x)
            weights = any(True for _ in layer.parameters())
            movable = index > 0 and split_channels(layer) is not None
            costs.append(LayerCost(flops, flops if index else 0.0, flops if weights else 0.0, movable))
    return costs


def report(name: str, costs: list[LayerCost]) -> None:
    for parts in (2, 3):
        found = {key: partitioner(costs, parts) for key, partitioner in PARTITIONER_FUNCTIONS.items()}
        for key, partition in found.items():
            work = [f"{w.total / 1e6:.1f}" for w in stage_work(costs, partition.stages, partition.moved)]
            moved = ", ".join(f"{share:.2f}" for share in partition.moved)
            print(f"{name:14} {parts}  {key:10} stages {partition.stages}  moved [{moved}]  MFLOPs {work}")
        gain = 1 - slowest(costs, found["layerpipe"]) / slowest(costs, found["pipedream"])
        print(f"{name:14} {parts}  layerpipe's slowest stage {gain:.0%} below pipedream's")


def main() -> None:
    torch.manual_seed(0)
    report("sample", flop_costs(as_network(make_network()), 32))
    vgg = build_network(load_spec(EXAMPLES / "vgg16-dsconv.yaml", ["finetune={}"]), None)
    assert isinstance(vgg.model, nn.Module)
    report("vgg16-dsconv", flop_costs(vgg, 32))


if __name__ == "__main__":
    main()
